package nats

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
)

// Source consumes a JetStream stream through a durable pull consumer with
// explicit acks. It implements driver.Puller, driver.Extender,
// driver.Releaser, driver.RedeliveryHorizoner and driver.HorizonHinter,
// and is safe for concurrent use.
type Source struct {
	c       config
	link    *link
	st, dlq jetstream.Stream
	cons    jetstream.Consumer
	ackWait time.Duration

	buf  chan *driver.Message // pulled and not yet returned by Receive; made by Start
	done chan struct{}        // closed by Close once the pull stopped

	closing sync.Once
	mu      sync.Mutex
	pull    jetstream.ConsumeContext // from the first Receive until stopPulling
	ended   <-chan struct{}          // closed when the pull ends
	stopped bool                     // stopPulling ran: by Release or Close
}

var (
	_ driver.Puller        = (*Source)(nil)
	_ driver.Extender      = (*Source)(nil)
	_ driver.Releaser      = (*Source)(nil)
	_ driver.HorizonHinter = (*Source)(nil)
)

// Open opens a Source on addr, a nats:// URL naming the stream and the
// consumer: it connects and checks (or, with WithDeclare(true), the
// default, creates) the stream, the dead-letter stream and the durable
// consumer. Messages are pulled from the first Receive on.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	s := &Source{done: make(chan struct{})}
	var err error
	if s.c, s.link, err = connect(addr, true, true, opts); err != nil {
		return nil, err
	}
	if err := s.declare(ctx); err != nil {
		s.link.close()
		return nil, err
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
		return s.declareConsumer(ctx, 0) // the server's MaxAckPending until Start
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

// Start implements driver.Source: the pull buffer and a declared
// consumer's MaxAckPending become the window, the lease the consumer's
// AckWait, extended up to max_extension (never with heartbeat=false);
// JetStream waits out a retry's delay itself.
func (s *Source) Start(ctx context.Context, st driver.Setup) (driver.Traits, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c.declare {
		if err := s.declareConsumer(ctx, st.Window); err != nil {
			return driver.Traits{}, err
		}
	}
	if st.Logger != nil {
		s.link.log.CompareAndSwap(nil, st.Logger)
	}
	s.buf = make(chan *driver.Message, st.Window)
	tr := driver.Traits{Lease: s.ackWait, MaxExtension: s.c.maxExtension, DelaysRetry: true}
	if !s.c.heartbeat {
		tr.MaxExtension = -1 // never extended
	}
	return tr, nil
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

// Receive implements driver.Puller: it waits for a pulled message and
// returns it with those already pulled, at most max. The pull's own
// trouble is logged, and the pull goes on.
func (s *Source) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	ended, err := s.pulling()
	if err != nil {
		return nil, err
	}
	var ms []*driver.Message
	select {
	case m := <-s.buf:
		ms = append(ms, m)
	case <-ended:
		return nil, driver.ErrSourceClosed
	case <-s.done:
		return nil, driver.ErrSourceClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(ms) < max {
		select {
		case m := <-s.buf:
			ms = append(ms, m)
		default:
			return ms, nil
		}
	}
	return ms, nil
}

// pulling starts the pull on its first call and returns a channel closed
// when the pull ends.
func (s *Source) pulling() (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return nil, driver.ErrSourceClosed
	case s.pull != nil:
		return s.ended, nil
	}
	s.sayHeld()
	cc, err := s.cons.Consume(s.take, jetstream.PullMaxMessages(cap(s.buf)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { s.warn("pulling", err) }))
	if err != nil {
		return nil, fmt.Errorf("nats: pulling from consumer %s: %w", s.c.consumer, err)
	}
	s.pull, s.ended = cc, cc.Closed()
	return s.ended, nil
}

func (s *Source) warn(what string, err error) {
	s.link.logger().Warn("idemq nats: "+what, "stream", s.c.stream, "consumer", s.c.consumer, "error", err)
}

// sayHeld logs, at the first Receive, the deliveries held unacknowledged
// (by a process killed before it settled them): they come back after the
// AckWait, and while they fill MaxAckPending nothing else comes.
func (s *Source) sayHeld() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ci, err := s.cons.Info(ctx)
	if err != nil || ci.NumAckPending == 0 {
		return
	}
	s.link.logger().Info("idemq nats: deliveries held unacknowledged by another or an earlier instance come back after the consumer's AckWait",
		"consumer", s.c.consumer, "held", ci.NumAckPending, "max_ack_pending", ci.Config.MaxAckPending,
		"ack_wait", ci.Config.AckWait, "setting", "ack_wait= (WithAckWait)")
}

// delivery is one pulled message (AckID the jetstream.Msg, BrokerKey the
// stream sequence) and its JetStream metadata.
type delivery struct {
	m  driver.Message
	md *jetstream.MsgMetadata
}

// take hands msg to Receive, or gives it back once the Source closed.
func (s *Source) take(msg jetstream.Msg) {
	at := time.Now() // the lease runs from here, not from Receive
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		s.warn("a message without JetStream metadata on "+msg.Subject(), err)
		return
	}
	h := headerMap(msg.Headers())
	id, ok := h[IDHeader]
	if !ok {
		id = h[s.c.idHeader]
	}
	d := &delivery{md: md, m: driver.Message{
		ID: id, Body: msg.Data(), Headers: h, Key: h[KeyHeader], Source: msg.Subject(), System: "nats",
		Attempt: int(md.NumDelivered), ReceivedAt: at, AckID: msg, BrokerKey: md.Sequence.Stream,
	}}
	d.m.Metadata = (*metadata)(d)
	select {
	case s.buf <- &d.m:
	case <-s.done:
		_ = msg.NakWithDelay(giveBackDelay)
	}
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the subject, the consumer, the Nats-Msg-Id, the stream and
// the message's stream and consumer sequences.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		md := m.md
		_ = yield("messaging.destination.name", slog.StringValue(m.m.Source)) &&
			yield("messaging.consumer.group.name", slog.StringValue(md.Consumer)) &&
			yield("messaging.message.id", slog.StringValue(m.m.Headers[natsgo.MsgIdHdr])) &&
			yield("messaging.nats.stream", slog.StringValue(md.Stream)) &&
			yield("messaging.nats.stream_sequence", slog.Uint64Value(md.Sequence.Stream)) &&
			yield("messaging.nats.consumer_sequence", slog.Uint64Value(md.Sequence.Consumer))
	}
}

// Close implements driver.Source: it stops pulling, gives back what the
// pull buffer holds (messages Receive never returned) with a short delay,
// and closes the connection (unless it came from WithConn).
func (s *Source) Close() (err error) {
	s.closing.Do(func() {
		back := s.stopPulling()
		close(s.done)
		if err = s.link.shut(); err != nil && back > 0 {
			err = fmt.Errorf("nats: giving back %d pulled messages on close: %w", back, err)
		} else {
			err = nil
		}
	})
	return err
}

// stopPulling ends the pull, once, and gives back the messages it pulled
// that Receive never returned; it returns how many.
func (s *Source) stopPulling() (back int) {
	s.mu.Lock()
	cc, ended := s.pull, s.ended
	s.pull, s.stopped = nil, true
	s.mu.Unlock()
	if cc == nil {
		return 0
	}
	// What arrives while the pull drains reaches the buffer; 5s at most.
	cc.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		select {
		case m := <-s.buf:
			_ = m.AckID.(jetstream.Msg).NakWithDelay(giveBackDelay)
			back++
			continue
		case <-ended:
		case <-ctx.Done():
		}
		if len(s.buf) == 0 {
			return back
		}
	}
}
