package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
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
// settlement attempted after the Source was closed: Close handed the
// message back to SQS (or left it to its visibility timeout), so nothing
// is sent and SQS redelivers it.
var ErrClosed = unsettled.ErrClosed

// errReleased is the reason of a held-back FIFO delivery released behind a
// returned one; it was never handed out.
var errReleased = errors.New("released behind a returned message of its FIFO group")

// Source consumes one SQS queue (standard or FIFO). It implements
// driver.Source, driver.BatchSettler, driver.WindowSetter,
// driver.RedeliveryHorizoner and driver.LoggerSetter, and is safe for
// concurrent use.
type Source struct {
	cl       *awssqs.Client
	q        *queueInfo
	dlq      *queueInfo // DeadLetterSend's target; nil in DeadLetterRedrive mode
	cfg      config
	vis      time.Duration // visibility timeout of each receive
	hbEvery  time.Duration
	ctx      context.Context // cancelled by Close
	cancel   context.CancelFunc
	pollCtx  context.Context // cancelled when Close stops waiting for long polls
	pollStop context.CancelFunc
	wg       sync.WaitGroup
	errs     chan error    // receive trouble for Receive to report, never blocks
	acks     chan ackReq   // single Acks for the deleters to coalesce
	deleting atomic.Bool   // deleters run: Ack may hand over to them
	avail    chan struct{} // signalled when ready grows
	space    chan struct{} // signalled when held shrinks
	logs     unsettled.Logger
	live     *unsettled.Set[string, *delivery] // by SQS MessageId

	mu      sync.Mutex
	window  int
	held    int // slots: deliveries unsettled plus receives in progress
	started bool
	closed  bool
	ready   []*delivery            // received, waiting for Receive
	groups  map[string][]*delivery // FIFO: per group, the delivery handed out first, then those held back
	orphans []*delivery            // received after Close, to release

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
	// Released counts messages made visible again at once: left unsettled
	// at Close, or held back behind a retried message of the same FIFO
	// group.
	Released int64
	// SettleRetries counts batch entries sent again after SQS failed them.
	SettleRetries int64
	// DeadLettered counts messages parked by DeadLetter, once each: a copy
	// whose original could not be deleted is counted when it is parked
	// again, and in DeadLetterRedrive mode a message counts on the receive
	// after which SQS moves it, not on each release before.
	DeadLettered int64
	// HeldBack counts FIFO messages held back until the earlier message
	// of their group received with them was settled.
	HeldBack int64
	// ReceiveCalls and DeleteCalls count ReceiveMessage and
	// DeleteMessageBatch requests (SQS bills per request).
	ReceiveCalls, DeleteCalls int64
}

// Open returns a Source for the queue addr names, an sqs:// URL as
// core.OpenSource takes it (sqs://QUEUE?region=…, or
// sqs://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE); opts override its
// parameters. It reads the queue's attributes (visibility timeout,
// retention, redrive policy, FIFO) and resolves the dead-letter queue; it
// creates nothing. Receiving starts at the first Receive, after the
// Consumer had its chance to call SetWindow.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	u, err := parseAddr("Open", addr)
	if err != nil {
		return nil, err
	}
	return openSource(ctx, u, driver.OpenConfig{}, opts)
}

func openSource(ctx context.Context, u *url.URL, oc driver.OpenConfig, opts []Option) (*Source, error) {
	cfg, cl, q, err := setup(ctx, "Open", u, oc, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{cl: cl, q: q, cfg: cfg, vis: q.visibility, hbEvery: cfg.heartbeatInterval, window: cfg.window,
		errs: make(chan error, 1), acks: make(chan ackReq), avail: make(chan struct{}, 1), space: make(chan struct{}, 1),
		groups: make(map[string][]*delivery)}
	if cfg.visibility > 0 {
		s.vis = cfg.visibility
	}
	if s.hbEvery == 0 {
		s.hbEvery = max(s.vis/3, 100*time.Millisecond)
	}
	if cfg.heartbeat && s.hbEvery >= s.vis {
		return nil, cfg.optErr("WithHeartbeatInterval", "%v is not shorter than the visibility timeout %v", s.hbEvery, s.vis)
	}
	if s.dlq, err = deadLetterQueue(ctx, &cfg, cl, q, cfg.deadLetterMode == DeadLetterSend); err != nil {
		return nil, err
	}
	s.logs.Init(cfg.logger)
	s.live = unsettled.New[string, *delivery](s.vis, cfg.maxExtension)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.pollCtx, s.pollStop = context.WithCancel(context.Background())
	return s, nil
}

// SetLogger implements driver.LoggerSetter: the Source logs to l unless
// WithLogger (or the logger given to core.OpenSource) chose its logger.
func (s *Source) SetLogger(l *slog.Logger) { s.logs.SetLogger(l) }

func (s *Source) log() *slog.Logger { return s.logs.Log() }

// Client returns the SQS client, an escape hatch for what the adapter does
// not cover.
func (s *Source) Client() *awssqs.Client { return s.cl }

// QueueURL returns the consumed queue's URL.
func (s *Source) QueueURL() string { return s.q.url }

// QueueName returns the consumed queue's name.
func (s *Source) QueueName() string { return s.q.name }

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.q.fifo }

// VisibilityTimeout returns the visibility timeout each receive asks for.
func (s *Source) VisibilityTimeout() time.Duration { return s.vis }

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	st := &s.stats
	return Stats{Received: st.received.Load(), Extended: st.extended.Load(), HeartbeatFailures: st.heartbeatFailures.Load(),
		Released: st.released.Load(), SettleRetries: st.settleRetries.Load(), DeadLettered: st.deadLettered.Load(),
		HeldBack: st.heldBack.Load(), ReceiveCalls: st.receiveCalls.Load(), DeleteCalls: st.deleteCalls.Load()}
}

// SetWindow implements driver.WindowSetter: it bounds the messages received
// and not yet settled (waiting in Receive, held back behind an earlier
// message of their FIFO group, or in the Consumer's hands) to n. Receivers
// ask SQS for no more than the room left.
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

// HorizonHint implements driver.HorizonHinter: the queue's (and its
// dead-letter queue's) MessageRetentionPeriod at most the store's
// retention.
func (s *Source) HorizonHint(retention time.Duration) string {
	secs := int64(retention / time.Second)
	names := s.q.name
	if s.dlq != nil {
		names += " and " + s.dlq.name
	}
	return fmt.Sprintf("set MessageRetentionPeriod of %s to at most %d seconds: aws sqs set-queue-attributes --queue-url URL --attributes MessageRetentionPeriod=%d", names, secs, secs)
}

// Receive implements driver.Source. A failing ReceiveMessage call is
// returned as an error to report it; the receivers keep polling, so
// calling Receive again is always safe.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	if !s.started && !s.closed {
		s.started = true
		s.wg.Add(s.cfg.receivers + ackDeleters)
		for range s.cfg.receivers {
			go s.receiver()
		}
		for range ackDeleters {
			go s.deleter()
		}
		if s.cfg.heartbeat {
			s.wg.Go(func() { unsettled.Heartbeat(s.ctx, s.hbEvery, s.beat) })
		}
		s.deleting.Store(true)
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
			s.ready[0] = nil
			s.ready = s.ready[1:]
			more := len(s.ready) > 0
			s.mu.Unlock()
			if more {
				signal(s.avail) // another caller may be waiting
			}
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
// other received messages are unsettled (keeping the consumer busy) it waits
// up to WithReceiveLinger for room for half a window (or max), so that each
// ReceiveMessage call brings several messages instead of one per settled
// message (SQS bills per request); then it polls for whatever room there is.
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

// receiver long-polls the queue for as many messages as the window has
// room for, until Close.
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
	return &awssqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(queueURL),
		MaxNumberOfMessages:         int32(n),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(vis / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	}
}

// accept turns received messages into deliveries: each holds one window
// slot until it is settled. A message this Source still holds that SQS
// hands out again supersedes the older delivery, whose visibility lapsed:
// its receipt handle no longer settles it (SQS may even accept its delete
// and keep the message). On a FIFO queue a message whose group already
// has one handed out is held back until that one is settled, so a group's
// messages are processed one after the other, in order.
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
	added := false
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
		added = true
	}
	s.mu.Unlock()
	if added {
		signal(s.avail)
	}
}

// outcome says how a delivery's settlement ended, for FIFO successors.
type outcome int

const (
	outcomeDone     outcome = iota + 1 // deleted, or its effect committed: successors may go
	outcomeReturned                    // it will be delivered again: successors must wait for it
)

// finish ends a settled delivery's life in the Source: it frees its window
// slot and, on a FIFO queue, hands out the group's next message or, when
// this one comes back, releases those held behind it so SQS delivers them
// after it.
func (s *Source) finish(d *delivery, how outcome) {
	var release []*delivery
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.held--
	added := false
	if chain := s.groups[d.group]; len(chain) > 0 && chain[0] == d {
		chain = chain[1:]
		if how == outcomeReturned {
			release, chain = chain, nil
			s.held -= len(release)
			for _, r := range release {
				s.live.Drop(r.e, errReleased)
			}
		} else if len(chain) > 0 {
			s.ready = append(s.ready, chain[0])
			added = true
		}
		if len(chain) == 0 {
			delete(s.groups, d.group)
		} else {
			s.groups[d.group] = chain
		}
	}
	s.mu.Unlock()
	signal(s.space)
	if added {
		signal(s.avail)
	}
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
// WithReleaseOnClose(false), makes every message still unsettled visible
// again at once so another consumer gets it. Settling such a message
// afterwards sends nothing and returns an error wrapping ErrClosed (and
// driver.ErrStaleDelivery).
//
// SQS may still hand messages to a long poll whose caller went away, and
// those would stay invisible for the visibility timeout: so polls in
// progress are left to finish (up to WithCloseTimeout) and what they bring
// is released too. Polls still running after that are cancelled.
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
// call. Entries SQS fails are sent again (WithSettleRetries) and never
// dropped silently: the returned error joins one error per delivery still
// not deleted, and SQS redelivers those (the dedup store then decides
// Duplicate).
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	own, errs := unsettled.Take("sqs", ds, func(cd driver.Delivery) (*delivery, bool) {
		d, ok := cd.(*delivery)
		return d, ok && d.src == s
	}, (*delivery).claim)
	if len(own) > 0 {
		failed := s.deleteBatch(ctx, own)
		for _, d := range own {
			s.finish(d, outcomeDone)
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

// ackReq is one single Ack waiting for a deleter.
type ackReq struct {
	d    *delivery
	done chan error
}

// deleter coalesces single Acks that arrive while it is busy into one
// DeleteMessageBatch call of up to ten entries. An Ack that finds it idle is
// sent at once, alone, so coalescing adds no latency; under load it saves
// requests, which SQS bills and rate-limits.
func (s *Source) deleter() {
	defer s.wg.Done()
	for {
		var reqs []ackReq
		select {
		case r := <-s.acks:
			reqs = append(reqs, r)
		case <-s.ctx.Done():
			return
		}
	more:
		for len(reqs) < 10 {
			select {
			case r := <-s.acks:
				reqs = append(reqs, r)
			default:
				break more
			}
		}
		ds := make([]*delivery, len(reqs))
		for i, r := range reqs {
			ds[i] = r.d
		}
		// The caller's context bounds its wait, not the call other Acks share.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		failed := s.deleteBatch(ctx, ds)
		cancel()
		for _, r := range reqs {
			r.done <- failed[r.d]
		}
	}
}

// beat extends, in ChangeMessageVisibilityBatch calls of ten, the
// deliveries extended (or received) at least half an interval ago, by a
// full visibility timeout but never past WithMaxExtension after the
// receipt: a message still unsettled then lapses, and SQS may hand it to
// another consumer, where the dedup key keeps its effect to one commit.
func (s *Source) beat(now time.Time) {
	secs := map[*delivery]int32{}
	var due []*unsettled.Entry[string, *delivery]
	for _, e := range s.live.Due(now, s.vis-s.hbEvery/2) {
		n := int32(min(s.vis, e.Received.Add(s.cfg.maxExtension).Sub(now)) / time.Second)
		if n >= 1 && now.Add(time.Duration(n)*time.Second).After(s.live.Lapses(e)) { // else at the cap: let it lapse
			secs[e.D] = n
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
		failed, err := s.changeVisibility(ctx, ds, func(d *delivery) int32 { return secs[d] })
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
				s.live.Extended(chunk[i:i+1], sent.Add(time.Duration(secs[e.D])*time.Second-s.vis))
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
