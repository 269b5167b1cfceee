package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// giveBackDelay is how soon JetStream redelivers what Close gives back.
const giveBackDelay = 200 * time.Millisecond

// Source consumes a JetStream stream through a durable pull consumer with
// explicit acks. It implements driver.Source, driver.BatchSettler,
// driver.WindowSetter, driver.RedeliveryHorizoner and driver.LoggerSetter.
// Receive may be called from several goroutines.
type Source struct {
	c       config
	link    *link
	st, dlq jetstream.Stream
	cons    jetstream.Consumer
	ackWait time.Duration

	logs unsettled.Logger
	live *unsettled.Set[uint64, jetstream.Msg] // by stream sequence

	mu     sync.Mutex
	it     jetstream.MessagesContext
	window int
	closed bool

	stop context.CancelFunc // ends the heartbeat
	wg   sync.WaitGroup
}

// Open opens a Source on addr, a nats:// URL naming the stream and the
// consumer: it connects, checks (or, with WithDeclare(true), the default,
// creates) the stream, the dead-letter stream and the durable consumer, and
// starts the heartbeat. Messages are received from the first Receive on.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	s := &Source{stop: func() {}}
	var err error
	if s.c, s.link, err = connect(addr, true, opts, &s.logs); err != nil {
		return nil, err
	}
	s.window = s.c.window
	if err := s.declare(ctx); err != nil {
		s.link.close()
		return nil, err
	}
	s.live = unsettled.New[uint64, jetstream.Msg](s.ackWait, s.c.maxExtension)
	if s.c.heartbeat {
		var hctx context.Context
		hctx, s.stop = context.WithCancel(context.Background())
		s.wg.Go(func() { unsettled.Heartbeat(hctx, max(s.ackWait/3, 10*time.Millisecond), s.beat) })
	}
	return s, nil
}

// declare finds or creates the streams and the consumer.
func (s *Source) declare(ctx context.Context) (err error) {
	c := &s.c
	if s.st, err = s.link.stream(ctx, c.stream, c.subject, "stream", c.declare, false); err != nil {
		return err
	}
	if s.dlq, err = s.link.stream(ctx, c.dlqStream, c.dlqSubject, "dead-letter stream", c.declare, true); err != nil {
		return err
	}
	if s.ackWait = c.ackWait; c.declare {
		return s.declareConsumer(ctx, s.window)
	}
	s.cons, err = s.link.js.Consumer(ctx, c.stream, c.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("nats: the consumer %s of stream %s does not exist (create it, or let the adapter with declare=true)", c.consumer, c.stream)
	} else if err != nil {
		return fmt.Errorf("nats: looking up the consumer %s of stream %s: %w", c.consumer, c.stream, err)
	}
	s.ackWait = s.cons.CachedInfo().Config.AckWait
	return nil
}

// declareConsumer creates or updates the durable consumer with window as
// its MaxAckPending.
func (s *Source) declareConsumer(ctx context.Context, window int) (err error) {
	s.cons, err = s.link.js.CreateOrUpdateConsumer(ctx, s.c.stream, jetstream.ConsumerConfig{
		Durable: s.c.consumer, FilterSubject: s.c.subject, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.c.ackWait, MaxAckPending: window, MaxDeliver: -1,
	})
	if err != nil {
		return fmt.Errorf("nats: declaring the consumer %s of stream %s: %w", s.c.consumer, s.c.stream, err)
	}
	return nil
}

func (s *Source) log() *slog.Logger { return s.logs.Log() }

// SetLogger implements driver.LoggerSetter: the Source logs to l unless
// WithLogger (or OpenConfig.Logger) chose its logger.
func (s *Source) SetLogger(l *slog.Logger) { s.logs.SetLogger(l) }

// SetWindow implements driver.WindowSetter: the declared consumer's
// MaxAckPending and the pull buffer become n. A consumer that is not
// declared keeps its MaxAckPending; only the pull buffer follows n. Call
// it before the first Receive.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("nats: window %d must be positive", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.it != nil {
		return errors.New("nats: SetWindow after the first Receive")
	}
	if s.c.declare && n != s.window {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.declareConsumer(ctx, n); err != nil {
			return err
		}
	}
	s.window = n
	return nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: the stream's
// MaxAge plus the dead-letter stream's (a parked message can be redriven
// until it expires there), driver.Unbounded when either has none.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, bool) {
	var total time.Duration
	for _, st := range []jetstream.Stream{s.st, s.dlq} {
		info, err := st.Info(ctx)
		if err != nil {
			return 0, false
		}
		if info.Config.MaxAge <= 0 {
			return driver.Unbounded, true
		}
		total += info.Config.MaxAge
	}
	return total, true
}

// HorizonHint implements driver.HorizonHinter: a MaxAge of at most half
// the retention on the stream and on its dead-letter stream.
func (s *Source) HorizonHint(retention time.Duration) string {
	age := (retention / 2).Truncate(time.Second)
	if age <= 0 {
		age = retention / 2
	}
	return fmt.Sprintf("give stream %s and its dead-letter stream %s a MaxAge of at most %v each: nats stream edit %s --max-age=%v; nats stream edit %s --max-age=%v",
		s.c.stream, s.c.dlqStream, age, s.c.stream, age, s.c.dlqStream, age)
}

// iterator returns the pull iterator, starting it on the first call.
func (s *Source) iterator() (jetstream.MessagesContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, driver.ErrSourceClosed
	}
	if s.it == nil {
		s.sayHeld()
		it, err := s.cons.Messages(jetstream.PullMaxMessages(s.window))
		if err != nil {
			return nil, fmt.Errorf("nats: pulling from consumer %s: %w", s.c.consumer, err)
		}
		s.it = it
	}
	return s.it, nil
}

// sayHeld logs, once at the first Receive, the deliveries another
// instance holds unacknowledged (a process killed before it settled
// them): JetStream hands them out again only after the AckWait, and while
// they fill MaxAckPending it delivers nothing else.
func (s *Source) sayHeld() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ci, err := s.cons.Info(ctx)
	if err != nil || ci.NumAckPending == 0 {
		return
	}
	s.log().Info("idemq nats: deliveries held unacknowledged by another or an earlier instance come back after the consumer's AckWait",
		"consumer", s.c.consumer, "held", ci.NumAckPending, "max_ack_pending", ci.Config.MaxAckPending,
		"ack_wait", ci.Config.AckWait, "setting", "ack_wait= (WithAckWait)")
}

// Receive implements driver.Source. Errors other than ErrSourceClosed and
// ctx's are transient (a missed pull heartbeat during a reconnect, say):
// the pull goes on.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	it, err := s.iterator()
	if err != nil {
		return nil, err
	}
	msg, err := it.Next(jetstream.NextContext(ctx))
	switch {
	case err == nil:
		return s.newDelivery(msg)
	case s.isClosed() || errors.Is(err, jetstream.ErrMsgIteratorClosed):
		return nil, driver.ErrSourceClosed
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("nats: receiving from consumer %s: %w", s.c.consumer, err)
}

func (s *Source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close implements driver.Source: it stops pulling and gives every
// unsettled delivery, and every message still in the pull buffer, back to
// JetStream at once (Nak), so they are redelivered without waiting for the
// AckWait. Settling those deliveries afterwards returns a stale error.
func (s *Source) Close() error {
	s.mu.Lock()
	it, closed := s.it, s.closed
	s.closed = true
	s.mu.Unlock()
	if closed {
		return nil
	}
	live := s.live.Close()
	s.stop()
	s.wg.Wait()
	// Stop pulling first: a pull request the server has not dropped yet
	// could take a message given back at once and hold it for its
	// AckWait, so the Nak asks for a short delay.
	var back []jetstream.Msg
	if it != nil {
		it.Drain()
		_ = s.link.nc.FlushTimeout(time.Second)
		next := func() (jetstream.Msg, error) { return it.Next(jetstream.NextMaxWait(time.Second)) }
		for m, err := next(); err == nil; m, err = next() {
			back = append(back, m)
		}
	}
	for _, e := range live {
		back = append(back, e.D)
	}
	for _, m := range back {
		_ = m.NakWithDelay(giveBackDelay)
	}
	err := s.link.nc.FlushTimeout(5 * time.Second)
	s.link.close()
	if err != nil && len(back) > 0 {
		return fmt.Errorf("nats: giving back %d unsettled deliveries on close: %w", len(back), err)
	}
	return nil
}

// AckBatch implements driver.BatchSettler. JetStream has no multiple ack
// for explicit-ack consumers (AckAll would also take the holes between),
// so it sends the plain acks and then one flush, whose answer confirms the
// server read every ack before it: one round trip for the batch.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	own, errs := unsettled.Take("nats", ds, func(d *delivery) bool { return d.s == s }, (*delivery).begin)
	if len(own) == 0 {
		return errors.Join(errs...)
	}
	// The last ack waits for the consumer's leader to answer it; the
	// others, sent before it on this connection, reach the leader first,
	// so its answer confirms them too (a flush proves only that the
	// server the client is connected to read them).
	for _, d := range own[:len(own)-1] {
		if err := d.msg().Ack(); err != nil {
			errs = append(errs, d.failed("ack", err))
		}
	}
	last := own[len(own)-1]
	ctx, cancel := bounded(ctx)
	defer cancel()
	if err := last.msg().DoubleAck(ctx); err != nil {
		errs = append(errs, fmt.Errorf("nats: confirming %d acks: %w", len(own), last.failed("ack", err)))
	}
	return errors.Join(errs...)
}
