package nats

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// harness runs the conformance suite on a fresh stream per fixture, with
// an AckWait of 2s: a lease that lapses does so well within the suite's
// receive timeout, and the Consumer's extensions (every 2/3s) keep the
// others.
//
// The fixture publishes the id in idemq-id, not Nats-Msg-Id: the suite
// publishes duplicates on purpose, to check the Consumer decides them
// Duplicate, and JetStream would drop them at publish within its
// duplicate window. TestNatsMsgID covers the Nats-Msg-Id path.
func harness() brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:        true,
		CarriesKey:          true,
		OperatesDeadLetters: true,
		Open: func(t *testing.T) *brokertest.Fixture {
			u := servicetest.NATSURL(t)
			ts := newTestStream(t, u)
			opts := ts.opts(t, WithAckWait(2*time.Second))
			// Declare the streams and the consumer before anything is
			// published or taken raw.
			s, err := Open(context.Background(), ts.addr(), opts...)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			s.Close()
			base := u + "/" + ts.name + "?consumer=worker&subject=" + url.QueryEscape(ts.subject)
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error {
					return ts.publishRaw(ctx, IDHeader, msgs...)
				},
				NewSource: func(t *testing.T) driver.Source {
					s, err := Open(context.Background(), ts.addr(), opts...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return &lapsing{Source: s}
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					return rawDeadLetters(ctx, ts)
				},
				Reconnect: lapseLeases,
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), ts.addr())
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw:          func(ctx context.Context) (brokertest.RawMessage, error) { return rawNext(ctx, ts) },
				SourceURL:    base + "&ack_wait=2s",
				PublisherURL: base,
			}
		},
	}
}

// rawDeadLetters reads the test stream's dead-letter stream with nats.go
// alone, by sequence.
func rawDeadLetters(ctx context.Context, ts testStream) ([]brokertest.DeadLetter, error) {
	st, err := ts.js.Stream(ctx, ts.name+"_DLQ")
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []brokertest.DeadLetter
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, brokertest.DeadLetter{ID: m.Header.Get(IDHeader), Body: m.Data, Cause: m.Header.Get(driver.CauseHeader)})
	}
	return out, nil
}

// rawNext takes the next message of the consumer "worker" with nats.go
// alone and acks it.
func rawNext(ctx context.Context, ts testStream) (brokertest.RawMessage, error) {
	c, err := ts.js.Consumer(ctx, ts.name, "worker")
	if err != nil {
		return brokertest.RawMessage{}, err
	}
	m, err := c.Next(jetstream.FetchContext(ctx))
	if err != nil {
		return brokertest.RawMessage{}, err
	}
	if err := m.DoubleAck(ctx); err != nil {
		return brokertest.RawMessage{}, err
	}
	h := headerMap(m.Headers())
	return brokertest.RawMessage{ID: h[DefaultIDHeader], Key: h[KeyHeader], Headers: h, Body: m.Data()}, nil
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness())
}
