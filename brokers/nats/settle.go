package nats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// giveBackDelay is how soon JetStream redelivers what Release and Close
// give back: a pull request still open could take it back at once.
const giveBackDelay = 200 * time.Millisecond

// Ack implements driver.Source with plain acks and a double ack last: the
// consumer's leader answers that one after it read the others, so one
// round trip confirms the set (AckAll would also take the holes between; a
// flush proves only that the connected server read them).
func (s *Source) Ack(ctx context.Context, ms []*driver.Message) error {
	return s.send(ctx, "ack", ms, func(_ int, m jetstream.Msg) error { return m.Ack() }, jetstream.Msg.DoubleAck)
}

// Retry implements driver.Source with NakWithDelay (a plain Nak for 0):
// JetStream waits out the delay.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.send(ctx, "nak", ms, func(_ int, m jetstream.Msg) error { return m.NakWithDelay(delay) }, nil)
}

// Release implements driver.Releaser: it stops pulling (so what it gives
// back does not come back here) and gives back the pull buffer, then ms,
// with a Nak delayed a little.
func (s *Source) Release(ctx context.Context, ms []*driver.Message) error {
	s.stopPulling()
	return s.send(ctx, "give-back", ms, func(_ int, m jetstream.Msg) error { return m.NakWithDelay(giveBackDelay) }, nil)
}

// Extend implements driver.Extender with InProgress, which restarts each
// message's AckWait, and a flush that confirms the server read them (an
// InProgress buffered while reconnecting is confirmed late or fails: the
// Consumer counts neither). A message settled meanwhile is no error.
func (s *Source) Extend(ctx context.Context, ms []*driver.Message) error {
	return s.send(ctx, "in-progress", ms, func(_ int, m jetstream.Msg) error {
		if err := m.InProgress(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return err
		}
		return nil
	}, nil)
}

// DeadLetter implements driver.Source: it publishes a copy of each message
// with the bookkeeping headers to the dead-letter subject, then terminates
// the original (Term), or gives it back (Nak) if the publish failed. The
// copy's Nats-Msg-Id derives from the stream sequence, so a message
// parked twice (Term lost) is kept once.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	at := time.Now() // before the publish: never later than the parking
	copies := make([]*natsgo.Msg, len(ms))
	for i, m := range ms {
		copies[i] = s.parkedCopy(m, causes[i], at)
	}
	parked := s.link.publish(ctx, copies)
	return s.send(ctx, "dead-letter", ms, func(i int, m jetstream.Msg) error {
		if parked[i] != nil {
			_ = m.Nak()
			return fmt.Errorf("publishing to %s: %w", s.c.dlqSubject, parked[i])
		}
		if err := m.Term(); err != nil {
			return fmt.Errorf("term after parking: %w", err)
		}
		return nil
	}, nil)
}

// parkedCopy is m's copy for the dead-letter subject.
func (s *Source) parkedCopy(m *driver.Message, cause error, at time.Time) *natsgo.Msg {
	jm, seq := m.AckID.(jetstream.Msg), m.BrokerKey.(uint64)
	h := natsgo.Header{}
	maps.Copy(h, jm.Headers()) // Nats-Msg-Id is replaced below
	if m.ID != "" {
		h.Set(IDHeader, m.ID)
	}
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: m.Attempt, Destination: jm.Subject(), At: at,
		Origin: fmt.Sprintf("%s/%s/%d", s.c.stream, s.c.consumer, seq)}
	for k, v := range mark.Headers() {
		h.Set(k, v)
	}
	h.Set(natsgo.MsgIdHdr, fmt.Sprintf("idemq-dlq:%s:%s:%d", s.c.stream, s.c.consumer, seq))
	return &natsgo.Msg{Subject: s.c.dlqSubject, Header: h, Data: jm.Data()}
}

// send sends op for each of ms and confirms them with one round trip:
// confirm, when given, sends the last one's and waits for the answer,
// else a flush. A message gets its op's error, else the confirmation's; on
// a closed connection that is stale (JetStream redelivers).
func (s *Source) send(ctx context.Context, what string, ms []*driver.Message, op func(int, jetstream.Msg) error, confirm func(jetstream.Msg, context.Context) error) error {
	if len(ms) == 0 {
		return nil
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	errs := make([]error, len(ms))
	last := len(ms) - 1
	for i, m := range ms {
		if i < last || confirm == nil {
			errs[i] = op(i, m.AckID.(jetstream.Msg))
		}
	}
	var err error
	if confirm != nil {
		err = confirm(ms[last].AckID.(jetstream.Msg), ctx)
	} else {
		err = s.link.nc.FlushWithContext(ctx)
	}
	for i, m := range ms {
		if errs[i] == nil {
			errs[i] = err
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("nats: %s of %s/%v: %w", what, s.c.stream, m.BrokerKey, errs[i])
			if errors.Is(errs[i], natsgo.ErrConnectionClosed) {
				errs[i] = driver.Stale(errs[i])
			}
		}
	}
	return driver.PartialOf(errs)
}
