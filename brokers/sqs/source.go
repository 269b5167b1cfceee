package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
	"github.com/idemq/idemq/internal/retry"
)

// DefaultIDAttribute is the message attribute that carries the producer's
// business id unless WithIDAttribute names another.
const DefaultIDAttribute = "message-id"

// AttributeEncoding is "base64" on messages whose body Publisher had to
// encode because SQS accepts only text; the Source decodes them.
const AttributeEncoding = "idemq-encoding"

// ErrClosed is wrapped, with driver.ErrStaleDelivery, by the error of a
// settlement after Close, which gave the message back to SQS: nothing is
// sent, and SQS redelivers it.
var ErrClosed = unsettled.ErrClosed

// errReleased is why a held-back FIFO delivery left the set unsettled.
var errReleased = errors.New("released behind a returned message of its FIFO group")

// Source consumes one SQS queue (standard or FIFO). It implements
// driver.Source, driver.BatchSettler, driver.WindowSetter,
// driver.RedeliveryHorizoner and driver.LoggerSetter, and is safe for
// concurrent use.
type Source struct {
	cl               *awssqs.Client
	q, dlq           *queueInfo // dlq: DeadLetterSend's target; nil in DeadLetterRedrive mode
	cfg              config
	vis, hbEvery     time.Duration   // vis: the visibility timeout of each receive
	ctx, pollCtx     context.Context // cancelled by Close; pollCtx when it stops waiting for long polls
	cancel, pollStop context.CancelFunc
	wg               sync.WaitGroup
	errs             chan error     // receive trouble for Receive to report, never blocks
	acks             chan *delivery // single Acks for the deleters to coalesce
	avail, space     chan struct{}  // signalled when ready grows, when held shrinks
	logs             unsettled.Logger
	live             *unsettled.Set[string, *delivery] // by SQS MessageId

	mu              sync.Mutex
	window, held    int // held: slots of deliveries unsettled plus receives in progress
	started, closed bool
	ready           []*delivery            // received, waiting for Receive
	groups          map[string][]*delivery // FIFO: per group, the delivery handed out first, then those held back
	orphans         []*delivery            // received after Close, to release

	stats struct {
		received, extended, heartbeatFailures, released, settleRetries, deadLettered, heldBack, deleteCalls, receiveCalls atomic.Int64
	}
}

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	// Received counts messages received from SQS.
	Received int64
	// Extended counts visibility extensions the heartbeat made.
	Extended int64
	// HeartbeatFailures counts extensions SQS refused or that failed.
	HeartbeatFailures int64
	// Released counts messages made visible again at once: unsettled at
	// Close, or held back behind a retried message of their FIFO group.
	Released int64
	// SettleRetries counts batch entries sent again after SQS failed them.
	SettleRetries int64
	// DeadLettered counts messages parked, once each.
	DeadLettered int64
	// HeldBack counts FIFO messages held back behind their group's.
	HeldBack int64
	// ReceiveCalls and DeleteCalls count ReceiveMessage and
	// DeleteMessageBatch requests (SQS bills per request).
	ReceiveCalls, DeleteCalls int64
}

// Open returns a Source for the queue addr names, an sqs:// URL as
// core.OpenSource takes it; opts override its parameters. It reads the
// queue's attributes and finds the dead-letter queue; it creates nothing.
// Receiving starts at the first Receive, after the Consumer's SetWindow.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	cfg, cl, q, err := setup(ctx, "Open", addr, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{cl: cl, q: q, cfg: cfg, vis: q.visibility, hbEvery: cfg.heartbeatInterval, window: cfg.window,
		errs: make(chan error, 1), acks: make(chan *delivery), avail: make(chan struct{}, 1), space: make(chan struct{}, 1),
		groups: make(map[string][]*delivery)}
	switch {
	case cfg.visibility > 0:
		s.vis = cfg.visibility
	case cfg.heartbeat: // else nothing extends it: the queue's, set for its handlers
		s.vis = min(s.vis, DefaultVisibilityTimeout)
	}
	if s.hbEvery == 0 {
		s.hbEvery = max(s.vis/3, 100*time.Millisecond)
	}
	if cfg.heartbeat && s.hbEvery >= s.vis {
		return nil, cfg.optErr("WithHeartbeatInterval", "%v is not shorter than the visibility timeout %v (%s sets a longer one)", s.hbEvery, s.vis, cfg.spell("WithVisibilityTimeout", "visibility="))
	}
	if s.dlq, err = deadLetterQueue(ctx, &cfg, cl, q, cfg.deadLetterMode == DeadLetterSend); err != nil {
		return nil, err
	}
	s.logs.Init(cfg.logger)
	s.live = unsettled.New[string, *delivery](s.vis, cfg.maxExtension)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.pollCtx, s.pollStop = context.WithCancel(context.Background())
	s.wg.Add(ackDeleters)
	for range ackDeleters {
		go s.deleter()
	}
	if cfg.heartbeat {
		s.wg.Go(func() { unsettled.Heartbeat(s.ctx, s.hbEvery, s.beat) })
	}
	return s, nil
}

// SetLogger implements driver.LoggerSetter: the Source logs to l unless
// WithLogger (or the logger given to core.OpenSource) chose its logger.
func (s *Source) SetLogger(l *slog.Logger) { s.logs.SetLogger(l) }

func (s *Source) log() *slog.Logger { return s.logs.Log() }

// QueueURL returns the consumed queue's URL.
func (s *Source) QueueURL() string { return s.q.url }

// QueueName returns the consumed queue's name.
func (s *Source) QueueName() string { return s.q.name }

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.q.fifo }

// VisibilityTimeout returns the visibility timeout each receive asks for
// (see WithVisibilityTimeout).
func (s *Source) VisibilityTimeout() time.Duration { return s.vis }

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	st := &s.stats
	return Stats{Received: st.received.Load(), Extended: st.extended.Load(), HeartbeatFailures: st.heartbeatFailures.Load(),
		Released: st.released.Load(), SettleRetries: st.settleRetries.Load(), DeadLettered: st.deadLettered.Load(),
		HeldBack: st.heldBack.Load(), ReceiveCalls: st.receiveCalls.Load(), DeleteCalls: st.deleteCalls.Load()}
}

// SetWindow implements driver.WindowSetter: at most n messages are
// received and unsettled (waiting in Receive, held back, or handed out).
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("sqs: SetWindow: window %d is below 1", n)
	}
	s.mu.Lock()
	s.window = n
	s.mu.Unlock()
	signal(s.space)
	return nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: the queue's
// MessageRetentionPeriod, or the dead-letter queue's when that is longer
// (a message parked there can be redriven).
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	h := s.q.retention
	if s.dlq != nil {
		h = max(h, s.dlq.retention)
	}
	return h, h > 0
}

// HorizonHint implements driver.HorizonHinter: a MessageRetentionPeriod
// of at most the store's retention.
func (s *Source) HorizonHint(retention time.Duration) string {
	names, secs := s.q.name, int64(retention/time.Second)
	if s.dlq != nil {
		names += " and " + s.dlq.name
	}
	return fmt.Sprintf("set MessageRetentionPeriod of %s to at most %d seconds: aws sqs set-queue-attributes --queue-url URL --attributes MessageRetentionPeriod=%d", names, secs, secs)
}

// Receive implements driver.Source. A failed ReceiveMessage call is
// returned as an error; the receivers keep polling.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	if !s.started && !s.closed {
		s.started = true
		s.wg.Add(s.cfg.receivers)
		for range s.cfg.receivers {
			go s.receiver()
		}
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, driver.ErrSourceClosed
		}
		if len(s.ready) > 0 {
			d := s.ready[0]
			s.ready[0], s.ready = nil, s.ready[1:]
			s.mu.Unlock()
			signal(s.avail) // another caller may be waiting
			return d, nil
		}
		s.mu.Unlock()
		select {
		case <-s.avail:
		case err := <-s.errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, driver.ErrSourceClosed
		}
	}
}

// signal wakes one waiter of a capacity-1 channel without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// reserve waits for room in the window and takes up to max slots. While
// other messages are unsettled it waits up to WithReceiveLinger for room
// for half a window (or max), so that each ReceiveMessage call brings
// several messages rather than one per settlement (SQS bills per request).
func (s *Source) reserve(max int) (int, bool) {
	var lingering time.Time // when room appeared but was short of half a window
	for {
		var wait <-chan time.Time
		s.mu.Lock()
		room := s.window - s.held
		if room > 0 && !s.closed {
			enough := room >= min(max, (s.window+1)/2) || s.held == 0
			if !enough && lingering.IsZero() {
				lingering = time.Now()
			}
			left := s.cfg.receiveLinger - time.Since(lingering)
			if enough || left <= 0 {
				n := min(room, max)
				s.held += n
				s.mu.Unlock()
				if room > n {
					signal(s.space) // let another receiver take the rest
				}
				return n, true
			}
			wait = time.After(left)
		}
		s.mu.Unlock()
		select {
		case <-s.space:
		case <-wait:
		case <-s.ctx.Done():
			return 0, false
		}
	}
}

// unreserve gives back n slots.
func (s *Source) unreserve(n int) {
	if n > 0 {
		s.mu.Lock()
		s.held -= n
		s.mu.Unlock()
		signal(s.space)
	}
}

// receiver long-polls for as many messages as the window has room for.
func (s *Source) receiver() {
	defer s.wg.Done()
	pause := retry.New(s.cfg.receiveErrorPause, 5*time.Second)
	for {
		n, ok := s.reserve(10)
		if !ok {
			return
		}
		s.stats.receiveCalls.Add(1)
		out, err := s.cl.ReceiveMessage(s.pollCtx, receiveInput(s.q.url, n, s.cfg.waitTime, s.vis))
		if err != nil {
			s.unreserve(n)
			if s.ctx.Err() != nil {
				return
			}
			wait := pause.Next()
			s.log().Warn("idemq sqs: receive failed", "queue", s.q.name, "error", err, "retry_in", wait)
			select {
			case s.errs <- fmt.Errorf("sqs: receive from %s: %w", s.q.name, err):
			default:
			}
			if !retry.Sleep(s.ctx, wait) {
				return
			}
			continue
		}
		pause.Reset()
		s.unreserve(n - len(out.Messages))
		if len(out.Messages) > 0 {
			s.accept(out.Messages)
		}
	}
}

// receiveInput asks for up to n messages with every attribute, hidden for
// vis.
func receiveInput(queueURL string, n int, wait, vis time.Duration) *awssqs.ReceiveMessageInput {
	return &awssqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: int32(n),
		WaitTimeSeconds: int32(wait / time.Second), VisibilityTimeout: int32(vis / time.Second), MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}}
}

// accept turns received messages into deliveries, each holding a window
// slot until settled. A message SQS hands out again supersedes the older
// delivery: its receipt handle no longer settles it (SQS may even accept
// its delete and keep the message). On a FIFO queue a message whose group
// has one handed out is held back until that one is settled.
func (s *Source) accept(msgs []types.Message) {
	now := time.Now()
	ds := make([]*delivery, len(msgs))
	for i := range msgs {
		ds[i] = s.newDelivery(&msgs[i], now)
	}
	s.stats.received.Add(int64(len(ds)))
	s.mu.Lock()
	if s.closed {
		s.orphans = append(s.orphans, ds...)
		s.mu.Unlock()
		return
	}
	for _, d := range ds {
		d.e = s.live.Add(aws.ToString(d.raw.MessageId), d)
		if s.q.fifo && d.group != "" {
			chain := s.groups[d.group]
			s.groups[d.group] = append(chain, d)
			if len(chain) > 0 {
				s.stats.heldBack.Add(1)
				continue
			}
		}
		s.ready = append(s.ready, d)
	}
	s.mu.Unlock()
	signal(s.avail)
}

// finish frees a settled delivery's window slot and, on a FIFO queue,
// hands out its group's next message or, when d comes back (returned),
// releases those held behind it so SQS delivers them after it.
func (s *Source) finish(d *delivery, returned bool) {
	var release []*delivery
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.held--
	if chain := s.groups[d.group]; len(chain) > 0 && chain[0] == d {
		chain = chain[1:]
		if returned {
			release, chain = chain, nil
			s.held -= len(release)
			for _, r := range release {
				s.live.Drop(r.e, errReleased)
			}
		} else if len(chain) > 0 {
			s.ready = append(s.ready, chain[0])
		}
		if len(chain) == 0 {
			delete(s.groups, d.group)
		} else {
			s.groups[d.group] = chain
		}
	}
	s.mu.Unlock()
	signal(s.space)
	signal(s.avail)
	if len(release) > 0 {
		if err := s.release(release); err != nil {
			s.log().Warn("idemq sqs: releasing messages held behind a returned FIFO message failed; they come back after their visibility timeout", "queue", s.q.name, "error", err)
		}
	}
}

// release makes ds visible again at once.
func (s *Source) release(ds []*delivery) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	failed := s.batchCall(ctx, ds, func(ctx context.Context, chunk []*delivery) (map[int]entryErr, error) {
		return s.changeVisibility(ctx, chunk, func(*delivery) int32 { return 0 })
	})
	s.stats.released.Add(int64(len(ds)))
	var errs []error
	for d, err := range failed {
		errs = append(errs, d.wrap(err))
	}
	return errors.Join(errs...)
}

// Close implements driver.Source: it stops receiving and, unless
// WithReleaseOnClose(false), makes every unsettled message visible again;
// settling one afterwards returns an error wrapping ErrClosed. SQS may
// still hand messages to a long poll whose caller went away, so polls in
// progress may finish (up to WithCloseTimeout) and what they bring is
// released too.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var left []*delivery
	for _, e := range s.live.Close() {
		left = append(left, e.D)
	}
	s.ready = nil
	clear(s.groups)
	s.mu.Unlock()
	s.cancel()
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(s.cfg.closeTimeout):
	}
	s.pollStop()
	<-waited
	s.mu.Lock()
	left = append(left, s.orphans...)
	s.orphans = nil
	s.mu.Unlock()
	if !s.cfg.releaseOnClose || len(left) == 0 {
		return nil
	}
	if err := s.release(left); err != nil {
		return fmt.Errorf("sqs: Close: releasing %d unsettled messages (they come back after their visibility timeout): %w", len(left), err)
	}
	return nil
}

// AckBatch implements driver.BatchSettler with DeleteMessageBatch, ten per
// call. Entries SQS fails are sent again (WithSettleRetries); the error
// joins one error per delivery still not deleted, which SQS redelivers.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	own, errs := unsettled.Take("sqs", ds, func(d *delivery) bool { return d.src == s }, (*delivery).claim)
	if len(own) > 0 {
		failed := s.deleteBatch(ctx, own)
		for _, d := range own {
			s.finish(d, false)
		}
		for d, err := range failed {
			errs = append(errs, d.wrap(fmt.Errorf("delete: %w", err)))
		}
	}
	return errors.Join(errs...)
}

// ackDeleters is how many goroutines send the DeleteMessageBatch calls of
// single Acks.
const ackDeleters = 2

// deleter coalesces single Acks that arrive while it is busy into one
// DeleteMessageBatch call of up to ten: an Ack that finds it idle goes at
// once, alone; under load it saves requests, which SQS bills.
func (s *Source) deleter() {
	defer s.wg.Done()
	for {
		var ds []*delivery
		select {
		case d := <-s.acks:
			ds = append(ds, d)
		case <-s.ctx.Done():
			return
		}
	more:
		for len(ds) < 10 {
			select {
			case d := <-s.acks:
				ds = append(ds, d)
			default:
				break more
			}
		}
		// The caller's context bounds its wait, not the call other Acks share.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		failed := s.deleteBatch(ctx, ds)
		cancel()
		for _, d := range ds {
			d.acked <- failed[d]
		}
	}
}

// beat extends the deliveries extended (or received) at least half an
// interval ago by a visibility timeout, never past WithMaxExtension after
// the receipt: an unsettled message then lapses, and the dedup key keeps
// the effect of its redelivery to one commit.
func (s *Source) beat(now time.Time) {
	var due []*unsettled.Entry[string, *delivery]
	for _, e := range s.live.Due(now, s.vis-s.hbEvery/2) {
		e.D.ext = int32(min(s.vis, e.Received.Add(s.cfg.maxExtension).Sub(now)) / time.Second)
		if e.D.ext >= 1 && now.Add(time.Duration(e.D.ext)*time.Second).After(s.live.Lapses(e)) { // else at the cap: let it lapse
			due = append(due, e)
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.vis)
	defer cancel()
	for start := 0; start < len(due); start += 10 {
		chunk := due[start:min(start+10, len(due))]
		ds := make([]*delivery, len(chunk))
		for i, e := range chunk {
			ds[i] = e.D
		}
		sent := time.Now()
		failed, err := s.changeVisibility(ctx, ds, func(d *delivery) int32 { return d.ext })
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.stats.heartbeatFailures.Add(int64(len(chunk)))
			s.log().Warn("idemq sqs: visibility heartbeat failed; trying again next beat", "queue", s.q.name, "messages", len(chunk), "error", err)
			continue
		}
		for i, e := range chunk {
			f, bad := failed[i]
			switch {
			case !bad:
				e.D.hbFailures = 0
				// SQS counts the new visibility from no sooner than sent.
				s.live.Extended(chunk[i:i+1], sent.Add(time.Duration(e.D.ext)*time.Second-s.vis))
				s.stats.extended.Add(1)
			case !e.Settled(): // a settled one's handle may be gone, as it should
				s.stats.heartbeatFailures.Add(1)
				e.D.hbFailures++
				gaveUp := f.permanent || e.D.hbFailures >= 3
				if f.gone {
					s.live.Drop(e, f.err) // settling it now would be refused too
				} else if gaveUp {
					s.live.GiveUp(e)
				}
				s.log().Warn("idemq sqs: visibility extension refused", "queue", s.q.name, "message_id", e.D.msg.ID, "error", f.err, "gave_up", gaveUp)
			}
		}
	}
}
