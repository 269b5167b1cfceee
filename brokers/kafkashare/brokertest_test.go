package kafkashare

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core/driver"
)

// harness runs the conformance suite on a fresh topic of 2 partitions and
// a fresh share group per fixture, on a cluster that locks records for
// testLock; the suite's messages are published by the kafka:// Publisher.
func harness() brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:   true,
		CarriesKey:     true,
		ReceiveTimeout: 15 * time.Second,
		// Not the dead-letter case: its redrive publishes the copies one
		// at a time, and the suite waits for both while holding the first,
		// which a share source that takes more only once its poll is
		// settled (WindowRefillsWhole) may have taken alone.
		// TestDeadLettersOperated covers admin.OpenDeadLetters here.
		OperatesDeadLetters: false,
		WindowRefillsWhole:  true,
		Open: func(t *testing.T) *brokertest.Fixture {
			bs := cluster(t, 10)
			topic := newTopic(t, bs, 2)
			group := "g-" + randomHex(3)
			url := sourceURL(bs, topic, group, "")
			open(t, url).Close() // sets the group's share.auto.offset.reset
			pub, err := kafka.NewPublisher(context.Background(), bs, kafka.WithTopic(topic))
			if err != nil {
				t.Fatalf("kafka.NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			dlq := client(t, bs, kgo.ConsumeTopics(topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error { return pub.Publish(ctx, "", msgs...) },
				NewSource: func(t *testing.T) driver.Source {
					s, err := Open(context.Background(), url)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, r := range pollSome(ctx, dlq) {
						h := headers(r)
						out = append(out, brokertest.DeadLetter{ID: h["message-id"], Body: r.Value, Cause: h[driver.CauseHeader]})
					}
					return out, nil
				},
				Reconnect: func(t *testing.T, src driver.Source) { lapseLocks(src.(*Source)) },
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := kafka.NewPublisher(context.Background(), bs, kafka.WithTopic(topic))
					if err != nil {
						t.Fatalf("kafka.NewPublisher: %v", err)
					}
					return p
				},
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					r, err := rawNext(ctx, bs, topic, group)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					h := headers(r)
					return brokertest.RawMessage{ID: h["message-id"], Key: string(r.Key), Headers: h, Body: r.Value}, nil
				},
				SourceURL:    url,
				PublisherURL: "kafka://" + bs + "/" + topic,
			}
		},
	}
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness())
}

// lapseLocks stops renewing src's records and returns once their locks
// have lapsed: their settlements are stale, and the broker delivers them
// again.
func lapseLocks(src *Source) {
	var last time.Time
	for _, e := range src.set.All() {
		src.set.GiveUp(e)
		if l := src.set.Lapses(e); l.After(last) {
			last = l
		}
	}
	// The broker's lock runs a tenth longer than the Source's reckoning,
	// and its sweep comes every 100ms.
	time.Sleep(time.Until(last) + testLock/10 + 300*time.Millisecond)
}

// rawNext takes one record off topic as a member of group, which joins
// for it and leaves (a member fetches records as soon as it joins, and
// holds what it fetched until it leaves).
func rawNext(ctx context.Context, bs, topic, group string) (*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bs, ",")...), kgo.ConsumeTopics(topic), kgo.ShareGroup(group),
		kgo.ShareMaxRecords(1), kgo.ShareMaxRecordsStrict())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		return nil, err
	}
	rs := fs.Records()
	if len(rs) == 0 {
		return nil, errors.New("no record")
	}
	for _, r := range rs {
		r.Ack(kgo.AckAccept)
	}
	return rs[0], cl.FlushAcks(ctx)
}

// pollSome returns the records cl has, waiting up to a second for some.
func pollSome(ctx context.Context, cl *kgo.Client) []*kgo.Record {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.PollFetches(ctx).Records()
}

func headers(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}
