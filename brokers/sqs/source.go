package sqs

import (
	"cmp"
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
)

// DefaultIDAttribute is the message attribute that carries the producer's
// business id unless WithIDAttribute names another.
const DefaultIDAttribute = "message-id"

// AttributeEncoding is "base64" on messages whose body Publisher had to
// encode because SQS accepts only text; the Source decodes them.
const AttributeEncoding = "idemq-encoding"

// Source consumes one SQS queue (standard or FIFO). It implements
// driver.Puller, driver.Extender, driver.Releaser,
// driver.RedeliveryHorizoner and driver.HorizonHinter, and is safe for
// concurrent use.
type Source struct {
	cl               *awssqs.Client
	q, dlq           *queueInfo // dlq: DeadLetterSend's target; nil in DeadLetterRedrive mode
	cfg              config
	vis              time.Duration   // the visibility timeout each receive asks for: the lease
	ctx, pollCtx     context.Context // cancelled by Close; pollCtx when it stops waiting for long polls
	cancel, pollStop context.CancelFunc
	busy             sync.WaitGroup // Receive calls and long polls in progress
	closeOnce        sync.Once
	avail            chan struct{} // signalled when ready grows
	log              *slog.Logger  // WithLogger's, else the Consumer's (from Start), else slog.Default()

	mu              sync.Mutex
	started, closed bool
	ready           []*delivery            // received, or let go by the message ahead in its FIFO group
	groups          map[string][]*delivery // FIFO: per group, the message handed out (or ready), then those held back
	heldBack        int                    // messages held back in groups

	stats struct {
		received, extended, heartbeatFailures, released, settleRetries, deadLettered, heldBack, deleteCalls, receiveCalls atomic.Int64
	}
}

var (
	_ driver.Puller        = (*Source)(nil)
	_ driver.Extender      = (*Source)(nil)
	_ driver.Releaser      = (*Source)(nil)
	_ driver.HorizonHinter = (*Source)(nil)
)

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	// Received counts messages received from SQS.
	Received int64
	// Extended counts visibility extensions made for the heartbeat.
	Extended int64
	// HeartbeatFailures counts extensions SQS refused or that failed.
	HeartbeatFailures int64
	// Released counts messages made visible again at once: given back
	// when the Consumer stopped, received but never handed out, or held
	// back behind a returned message of their FIFO group.
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
// Receiving starts when the Consumer starts the Source.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	cfg, cl, q, err := setup(ctx, "Open", addr, true, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{cl: cl, q: q, cfg: cfg, vis: q.visibility, log: cmp.Or(cfg.logger, slog.Default()), avail: make(chan struct{}, 1),
		groups: make(map[string][]*delivery)}
	switch {
	case cfg.visibility > 0:
		s.vis = cfg.visibility
	case cfg.heartbeat: // else nothing extends it: the queue's, set for its handlers
		s.vis = min(s.vis, DefaultVisibilityTimeout)
	}
	if s.dlq, err = deadLetterQueue(ctx, &cfg, cl, q, cfg.deadLetterMode == DeadLetterSend); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.pollCtx, s.pollStop = context.WithCancel(context.Background())
	return s, nil
}

// Start implements driver.Source. The Consumer keeps WithReceivers long
// polls outstanding, each asking for up to ten messages hidden for the
// visibility timeout (the lease), which its heartbeat renews (Extend) up
// to WithMaxExtension, never with WithHeartbeat(false). SQS waits out a
// Retry's delay itself.
func (s *Source) Start(_ context.Context, st driver.Setup) (driver.Traits, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return driver.Traits{}, driver.ErrSourceClosed
	case s.started:
		return driver.Traits{}, errors.New("sqs: Start called twice")
	}
	s.started = true
	if s.cfg.logger == nil && st.Logger != nil {
		s.log = st.Logger
	}
	// A receive is a billed request: it waits a moment for room for more.
	tr := driver.Traits{MaxBatch: 10, Receivers: s.cfg.receivers, Lease: s.vis, MaxExtension: s.cfg.maxExtension,
		DelaysRetry: true, ReceiveLinger: 50 * time.Millisecond}
	if tr.Receivers == 0 {
		tr.Receivers = min(max(2, (st.Window+9)/10), 64)
	}
	if !s.cfg.heartbeat {
		tr.MaxExtension = -1
	}
	return tr, nil
}

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

// Receive implements driver.Puller: it returns the messages waiting (a
// FIFO message let go by its group's earlier one, or what a poll whose
// caller stopped waiting brought), else long-polls SQS for up to max (ten
// at most, fewer by the FIFO messages held back, which count in the
// window too). A failed ReceiveMessage is logged and returned.
func (s *Source) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	var p *poll // this call's, in flight
	s.mu.Lock()
	if !s.closed {
		s.busy.Add(1) // Close waits for it
		defer func() {
			s.abandon(p)
			s.busy.Done()
		}()
	}
	for ; ; s.mu.Lock() { // s.mu is held at the start of each turn
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, driver.ErrSourceClosed
		case !s.started:
			s.mu.Unlock()
			return nil, errors.New("sqs: Receive before Start")
		case len(s.ready) > 0:
			n := min(max, len(s.ready))
			ms := messages(s.ready[:n])
			clear(s.ready[:n])
			if s.ready = s.ready[n:]; len(s.ready) > 0 {
				signal(s.avail) // for another caller
			}
			s.mu.Unlock()
			return ms, nil
		}
		if n := min(max, 10) - s.heldBack; p == nil && n > 0 {
			p = s.poll(n)
		}
		s.mu.Unlock()
		var polled <-chan struct{} // nil while the held-back messages fill max
		if p != nil {
			polled = p.done
		}
		select {
		case <-polled:
			ds, err := p.ds, p.err
			switch p = nil; {
			case err != nil && s.ctx.Err() != nil:
				return nil, driver.ErrSourceClosed
			case err != nil:
				return nil, err
			case len(ds) > 0:
				return messages(ds), nil
			}
		case <-s.avail:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, driver.ErrSourceClosed
		}
	}
}

func messages(ds []*delivery) []*driver.Message {
	ms := make([]*driver.Message, len(ds))
	for i, d := range ds {
		ms[i] = &d.msg
	}
	return ms
}

// signal wakes one waiter of a capacity-1 channel without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// poll is one ReceiveMessage call: done is closed once ds or err is set.
// What an abandoned poll (its caller went away) brings is made ready.
type poll struct {
	done      chan struct{}
	ds        []*delivery
	err       error
	abandoned bool // guarded by Source.mu
}

// poll starts a long poll for up to n messages; s.mu is held.
func (s *Source) poll(n int) *poll {
	p := &poll{done: make(chan struct{})}
	s.busy.Add(1)
	s.stats.receiveCalls.Add(1)
	go func() {
		defer s.busy.Done()
		out, err := s.cl.ReceiveMessage(s.pollCtx, receiveInput(s.q.url, n, s.cfg.waitTime, s.vis))
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("idemq sqs: receive failed", "queue", s.q.name, "error", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if p.err = err; err != nil {
			p.err = fmt.Errorf("sqs: receive from %s: %w", s.q.name, err)
		} else if p.ds = s.acceptLocked(out.Messages, time.Now()); p.abandoned {
			s.readyLocked(p.ds)
		}
		close(p.done)
	}()
	return p
}

// abandon makes what p, whose caller no longer waits, brings ready.
func (s *Source) abandon(p *poll) {
	if p == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-p.done:
		s.readyLocked(p.ds)
	default:
		p.abandoned = true
	}
}

// readyLocked makes ds ready for Receive; s.mu is held.
func (s *Source) readyLocked(ds []*delivery) {
	if len(ds) > 0 {
		s.ready = append(s.ready, ds...)
		signal(s.avail)
	}
}

// receiveInput asks for up to n messages with every attribute.
func receiveInput(queueURL string, n int, wait, vis time.Duration) *awssqs.ReceiveMessageInput {
	return &awssqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: int32(n),
		WaitTimeSeconds: int32(wait / time.Second), VisibilityTimeout: int32(vis / time.Second), MessageAttributeNames: []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}}
}

// acceptLocked returns the messages received at now that are to be handed
// out; s.mu is held. On a FIFO queue a message whose group has one handed
// out (or ready) is held back behind it until that one is settled. SQS
// hands out no message of a group while one is in flight, so a group's
// first in a receive means those held before lapsed: they are dropped.
func (s *Source) acceptLocked(msgs []types.Message, now time.Time) []*delivery {
	s.stats.received.Add(int64(len(msgs)))
	var out []*delivery
	var fresh map[string]bool // groups this receive started again
	for i := range msgs {
		d := s.newDelivery(&msgs[i], now)
		if !s.q.fifo || d.msg.Key == "" {
			out = append(out, d)
			continue
		}
		chain := s.groups[d.msg.Key]
		if !fresh[d.msg.Key] {
			if fresh == nil {
				fresh = map[string]bool{}
			}
			fresh[d.msg.Key] = true
			s.heldBack -= max(len(chain)-1, 0)
			chain = nil
		}
		if len(chain) > 0 {
			s.heldBack++
			s.stats.heldBack.Add(1)
		} else {
			out = append(out, d)
		}
		s.groups[d.msg.Key] = append(chain, d)
	}
	return out
}

// settled keeps FIFO order once ds were settled (errs[i] is ds[i]'s): a
// message deleted (gone) lets the next of its group out; one that comes
// back makes those held behind it visible again, to come after it.
func (s *Source) settled(ctx context.Context, ds []*delivery, errs []error, gone bool) {
	if !s.q.fifo {
		return
	}
	var back []*delivery
	s.mu.Lock()
	for i, d := range ds {
		if d == nil || len(s.groups[d.msg.Key]) == 0 || s.groups[d.msg.Key][0] != d {
			continue
		}
		chain := s.groups[d.msg.Key]
		if chain = chain[1:]; gone && errs[i] == nil && len(chain) > 0 {
			chain[0].msg.ReceivedAt = chain[0].renewed // its lease counts from its last renewal
			s.readyLocked(chain[:1])
			s.heldBack--
		} else if !gone || errs[i] != nil {
			back = append(back, chain...)
			s.heldBack -= len(chain)
			chain = nil
		}
		if len(chain) == 0 {
			delete(s.groups, d.msg.Key)
		} else {
			s.groups[d.msg.Key] = chain
		}
	}
	s.mu.Unlock()
	if err := errors.Join(s.release(ctx, back)...); err != nil {
		s.log.Warn("idemq sqs: releasing messages held behind a returned FIFO message failed; they come back after their visibility timeout", "queue", s.q.name, "error", err)
	}
}

// release makes ds visible again at once and returns the error of each.
func (s *Source) release(ctx context.Context, ds []*delivery) []error {
	errs := s.setVisibility(ctx, ds, atOnce)
	for _, err := range errs {
		if err == nil {
			s.stats.released.Add(1)
		}
	}
	return errs
}

// Close implements driver.Source: it lets polls in progress finish (up
// to WithCloseTimeout) and, unless WithReleaseOnClose(false), makes the
// messages received that the Consumer never got (FIFO messages held back
// among them) visible again at once. Settling or extending a message
// afterwards sends nothing and returns an error wrapping ErrClosed.
func (s *Source) Close() (err error) {
	s.closeOnce.Do(func() { err = s.shut() })
	return err
}

// shut is Close's first call.
func (s *Source) shut() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel() // Receive calls return, abandoning their polls
	waited := make(chan struct{})
	go func() { s.busy.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(s.cfg.closeTimeout):
	}
	s.pollStop()
	<-waited
	s.mu.Lock()
	left := s.ready
	for _, chain := range s.groups {
		left = append(left, chain[1:]...)
	}
	s.ready, s.heldBack = nil, 0
	clear(s.groups)
	s.mu.Unlock()
	if !s.cfg.releaseOnClose || len(left) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := errors.Join(s.release(ctx, left)...); err != nil {
		return fmt.Errorf("sqs: Close: releasing %d messages never handed out (they come back after their visibility timeout): %w", len(left), err)
	}
	return nil
}
