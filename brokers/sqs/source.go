package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/internal/retry"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// DefaultIDAttribute is the message attribute that carries the producer's
// business id unless WithIDAttribute names another.
const DefaultIDAttribute = "message-id"

// Message attributes the adapter writes on copies it sends to a dead-letter
// queue, besides the cause (driver.CauseHeader, "idemq-cause", at most
// 1,024 bytes).
const (
	// AttributeSourceQueue holds the name of the queue the message was
	// dead-lettered from.
	AttributeSourceQueue = "idemq-source-queue"
	// AttributeAttempt holds the attempt (receive count) the message had.
	AttributeAttempt = "idemq-attempt"
	// AttributeEncoding is "base64" on messages whose body Publisher had to
	// encode because SQS accepts only text; the Source decodes them.
	AttributeEncoding = "idemq-encoding"
)

// ErrClosed is wrapped by the error of a settlement attempted after the
// Source was closed: Close handed the message back to SQS (or left it to
// its visibility timeout), so nothing is sent and SQS redelivers it. It
// wraps driver.ErrStaleDelivery, as every stale settlement's error does.
var ErrClosed = driver.Stale(errors.New("sqs: source closed; SQS will redeliver the message"))

// Source consumes one SQS queue (standard or FIFO). It implements
// driver.Source, driver.BatchSettler, driver.WindowSetter and
// driver.RedeliveryHorizoner, and is safe for concurrent use.
type Source struct {
	cl       *awssqs.Client
	q        *queueInfo
	dlq      *queueInfo // DeadLetterSend target; nil in DeadLetterRedrive mode
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

	mu      sync.Mutex
	window  int
	held    int // slots: deliveries unsettled plus receives in progress
	started bool
	closed  bool
	ready   []*delivery            // received, waiting for Receive
	live    map[*delivery]struct{} // received and unsettled, for heartbeat and Close
	byMsgID map[string]*delivery   // live deliveries by SQS MessageId, to see a message handed out again
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
	// after which SQS moves it (its receive count reached
	// maxReceiveCount), not on each release before.
	DeadLettered int64
	// HeldBack counts FIFO messages held back until the earlier message
	// of their group received with them was settled.
	HeldBack int64
	// ReceiveCalls and DeleteCalls count ReceiveMessage and
	// DeleteMessageBatch requests (SQS bills per request).
	ReceiveCalls, DeleteCalls int64
}

var (
	_ driver.Source              = (*Source)(nil)
	_ driver.BatchSettler        = (*Source)(nil)
	_ driver.WindowSetter        = (*Source)(nil)
	_ driver.RedeliveryHorizoner = (*Source)(nil)
	_ driver.LoggerSetter        = (*Source)(nil)
)

// Open returns a Source for the queue given by URL
// (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME) or by name. It reads the
// queue's attributes (visibility timeout, retention, redrive policy, FIFO)
// and resolves the dead-letter queue; it creates nothing. Receiving starts
// at the first Receive, after the Consumer had its chance to call
// SetWindow.
func Open(ctx context.Context, queueURLOrName string, opts ...Option) (*Source, error) {
	cfg, cl, q, err := setup(ctx, "Open", queueURLOrName, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{
		cl:      cl,
		q:       q,
		cfg:     cfg,
		vis:     q.visibility,
		errs:    make(chan error, 1),
		acks:    make(chan ackReq),
		avail:   make(chan struct{}, 1),
		space:   make(chan struct{}, 1),
		window:  cfg.window,
		live:    make(map[*delivery]struct{}),
		byMsgID: make(map[string]*delivery),
		groups:  make(map[string][]*delivery),
	}
	if cfg.visibility > 0 {
		s.vis = cfg.visibility
	}
	s.hbEvery = cfg.heartbeatInterval
	if s.hbEvery == 0 {
		s.hbEvery = max(s.vis/3, 100*time.Millisecond)
	}
	if cfg.heartbeat && s.hbEvery >= s.vis {
		return nil, cfg.optErr("WithHeartbeatInterval", "%v is not shorter than the visibility timeout %v", s.hbEvery, s.vis)
	}
	target, err := deadLetterTarget(&cfg, q)
	if err != nil {
		return nil, err
	}
	if cfg.deadLetterMode == DeadLetterSend {
		if s.dlq, err = resolveDeadLetterQueue(ctx, &cfg, cl, q, target); err != nil {
			return nil, err
		}
	}
	if cfg.loggerSet {
		s.logs.Init(cfg.logger)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.pollCtx, s.pollStop = context.WithCancel(context.Background())
	return s, nil
}

// SetLogger sets the logger of the Source's warnings, unless WithLogger
// (or the logger given to core.OpenSource) chose one; the Consumer calls it
// with its own logger before the first Receive (driver.LoggerSetter).
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
	return Stats{
		Received:          s.stats.received.Load(),
		Extended:          s.stats.extended.Load(),
		HeartbeatFailures: s.stats.heartbeatFailures.Load(),
		Released:          s.stats.released.Load(),
		SettleRetries:     s.stats.settleRetries.Load(),
		DeadLettered:      s.stats.deadLettered.Load(),
		HeldBack:          s.stats.heldBack.Load(),
		ReceiveCalls:      s.stats.receiveCalls.Load(),
		DeleteCalls:       s.stats.deleteCalls.Load(),
	}
}

// SetWindow bounds the messages received and not yet settled — whether
// waiting in Receive, held back behind an earlier message of their FIFO
// group, or in the Consumer's hands — to n. Receivers ask SQS for no more
// than the room left.
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

// RedeliveryHorizon returns how long SQS may still hand a message out after
// it was sent: the queue's MessageRetentionPeriod, or the dead-letter
// queue's when that is longer (a message parked there can be redriven).
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

// Receive returns the next delivery. It blocks until one arrives, ctx is
// done, or the Source is closed (driver.ErrSourceClosed). A failing
// ReceiveMessage call is returned as an error to report it; the receivers
// keep polling, so calling Receive again is always safe.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, driver.ErrSourceClosed
	}
	if !s.started {
		s.started = true
		s.wg.Add(s.cfg.receivers)
		for range s.cfg.receivers {
			go s.receiver()
		}
		if s.cfg.heartbeat {
			s.wg.Add(1)
			go s.heartbeat()
		}
		s.wg.Add(ackDeleters)
		for range ackDeleters {
			go s.deleter()
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

// deadLetterTarget returns the dead-letter queue (URL or name) of q under
// cfg's DeadLetterMode: the WithDeadLetterQueue one or the redrive
// policy's target for DeadLetterSend, the redrive policy's target for
// DeadLetterRedrive. It fails when the mode has no queue to park in.
func deadLetterTarget(cfg *config, q *queueInfo) (string, error) {
	if cfg.deadLetterMode == DeadLetterRedrive {
		if q.redrive == nil {
			return "", cfg.optErr("WithDeadLetterMode", "%s needs a redrive policy on queue %q", cfg.spell("DeadLetterRedrive", "redrive"), q.name)
		}
		return queueNameFromARN(q.redrive.targetARN), nil
	}
	target := cfg.deadLetterQueue
	if target == "" && q.redrive != nil {
		target = queueNameFromARN(q.redrive.targetARN)
	}
	if target == "" {
		return "", cfg.optErr("WithDeadLetterQueue", "queue %q has no redrive policy, so name the dead-letter queue (or use %s on a queue that has one)",
			q.name, cfg.spell("WithDeadLetterMode(DeadLetterRedrive)", "dead_letter_mode=redrive"))
	}
	return target, nil
}

// resolveDeadLetterQueue reads the dead-letter queue target of q, which
// must be FIFO exactly when q is.
func resolveDeadLetterQueue(ctx context.Context, cfg *config, cl *awssqs.Client, q *queueInfo, target string) (*queueInfo, error) {
	option := "WithDeadLetterQueue"
	if cfg.deadLetterMode == DeadLetterRedrive {
		option = "WithDeadLetterMode"
	}
	dlq, err := resolveQueue(ctx, cl, target)
	if err != nil {
		return nil, cfg.optErr(option, "%v", err)
	}
	if dlq.fifo != q.fifo {
		return nil, cfg.optErr(option, "dead-letter queue %q and queue %q must both be FIFO or both standard", dlq.name, q.name)
	}
	return dlq, nil
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
				more := room > n
				s.mu.Unlock()
				if more {
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

func (s *Source) unreserve(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.held -= n
	s.mu.Unlock()
	signal(s.space)
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
		out, err := s.cl.ReceiveMessage(s.pollCtx, &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.q.url),
			MaxNumberOfMessages:         int32(n),
			WaitTimeSeconds:             int32(s.cfg.waitTime / time.Second),
			VisibilityTimeout:           int32(s.vis / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
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

// accept turns received messages into deliveries: each holds one window
// slot until it is settled. On a FIFO queue a message whose group already
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
		s.live[d] = struct{}{}
		// SQS handing out a message this Source still holds means the
		// visibility lapsed: the older delivery's receipt handle no longer
		// settles it (SQS may even accept its delete and keep the message).
		if old := s.byMsgID[d.msgID()]; old != nil {
			old.gone = fmt.Errorf("SQS handed the message out again (receive count %d), replacing its receipt handle", d.msg.Attempt)
		}
		s.byMsgID[d.msgID()] = d
		if s.q.fifo && d.group != "" {
			chain := s.groups[d.group]
			s.groups[d.group] = append(chain, d)
			if len(chain) > 0 {
				s.stats.heldBack.Add(1)
				continue // held back behind the group's earlier message
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

// finish ends a delivery's life in the Source: it frees its window slot,
// stops its heartbeat and, on a FIFO queue, hands out the group's next
// message or, when this one comes back, releases those held behind it so
// SQS delivers them after it.
func (s *Source) finish(d *delivery, how outcome) {
	var release []*delivery
	s.mu.Lock()
	if d.state == stateClosed {
		s.mu.Unlock()
		return
	}
	d.state = stateDone
	s.forget(d)
	s.held--
	added := false
	if s.q.fifo && d.group != "" {
		chain := s.groups[d.group]
		if len(chain) > 0 && chain[0] == d {
			chain = chain[1:]
			if how == outcomeReturned {
				release = chain
				for _, r := range release {
					r.state = stateDone
					s.forget(r)
					s.held--
				}
				chain = nil
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
	}
	s.mu.Unlock()
	signal(s.space)
	if added {
		signal(s.avail)
	}
	if len(release) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.changeVisibility(ctx, release, 0); err != nil {
			s.log().Warn("idemq sqs: releasing messages held behind a returned FIFO message failed; they come back after their visibility timeout", "queue", s.q.name, "error", err)
		}
		s.stats.released.Add(int64(len(release)))
	}
}

// forget drops d from the live deliveries; s.mu is held.
func (s *Source) forget(d *delivery) {
	delete(s.live, d)
	if s.byMsgID[d.msgID()] == d {
		delete(s.byMsgID, d.msgID())
	}
}

// Close stops receiving and, unless WithReleaseOnClose(false), makes every
// message still unsettled visible again at once so another consumer gets
// it. Settling such a message afterwards sends nothing and returns an
// error wrapping ErrClosed (and driver.ErrStaleDelivery).
//
// Long polls in progress are left to finish (up to WithCloseTimeout) and
// what they bring is released too: SQS may still hand messages to a poll
// whose caller went away, and those would stay invisible for the
// visibility timeout. Polls still running after WithCloseTimeout are
// cancelled, and what SQS gives them comes back after the visibility
// timeout. Close waits for the receivers and the heartbeat to stop.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var left []*delivery
	for d := range s.live {
		if d.state == stateLive {
			d.state = stateClosed
			left = append(left, d)
		}
	}
	clear(s.live)
	clear(s.byMsgID)
	s.ready = nil
	clear(s.groups)
	s.mu.Unlock()
	if s.cancel == nil { // never opened
		return nil
	}
	s.cancel()
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	t := time.NewTimer(s.cfg.closeTimeout)
	select {
	case <-waited:
	case <-t.C:
	}
	t.Stop()
	s.pollStop()
	<-waited
	s.mu.Lock()
	left = append(left, s.orphans...)
	s.orphans = nil
	s.mu.Unlock()
	if !s.cfg.releaseOnClose || len(left) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.changeVisibility(ctx, left, 0)
	s.stats.released.Add(int64(len(left)))
	if err != nil {
		return fmt.Errorf("sqs: Close: releasing %d unsettled messages (they come back after their visibility timeout): %w", len(left), err)
	}
	return nil
}

// AckBatch deletes the deliveries with DeleteMessageBatch, ten per call.
// Entries SQS fails are sent again (WithSettleRetries) and never dropped
// silently: the returned error joins one error per delivery still not
// deleted, and SQS redelivers those (the dedup store then decides
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
// sent at once, alone, so coalescing adds no latency; under load (the
// Consumer settles each message of batch size 1 from its own goroutine) it
// saves requests, which SQS bills and rate-limits.
func (s *Source) deleter() {
	defer s.wg.Done()
	for {
		var first ackReq
		select {
		case first = <-s.acks:
		case <-s.ctx.Done():
			return
		}
		reqs := []ackReq{first}
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
		// Each Ack was handed over whole; the caller's context bounds its
		// wait, not the call other Acks share.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		failed := s.deleteBatch(ctx, ds)
		cancel()
		for _, r := range reqs {
			r.done <- failed[r.d]
		}
	}
}
