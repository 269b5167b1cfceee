package benchmark

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The franz-go baselines are the Kafka consumers a team writes by hand on
// twmb/franz-go, the client idemq's Kafka adapter is built on, beside the
// kafka-go ones of kafka.go: group members that poll, run the store's
// transaction and commit the offsets they took, synchronously, before they
// poll again. Kafka only.

// franzBroker is a broker side that can run the franz-go baselines.
type franzBroker interface {
	franzSeed(ctx context.Context, e *runEnv, t *tracker, workers int) (*counts, error)
	franzBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error)
}

var _ franzBroker = (*kafkaBroker)(nil)

// franzMember is one member of the run's consumer group on franz-go,
// committing by hand, starting at the topic's beginning.
func (k *kafkaBroker) franzMember(e *runEnv) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(k.brokers...), kgo.ConsumerGroup(e.consumer), kgo.ConsumeTopics(e.queue),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250*time.Millisecond), kgo.SessionTimeout(10*time.Second), kgo.HeartbeatInterval(250*time.Millisecond))
}

// franzMsg is a record as the raw consumers see it.
func franzMsg(r *kgo.Record) msg {
	out := msg{body: r.Value}
	for _, h := range r.Headers {
		switch h.Key {
		case kafkaIDHeader:
			out.id = string(h.Value)
		case headerTS:
			out.ts, _ = strconv.ParseInt(string(h.Value), 10, 64)
		}
	}
	return out
}

// franzMembers runs workers members of the group, each polling up to size
// records at a time and handing them to do, then committing the highest
// offset per partition it polled (CommitRecords), until ctx ends. do
// retries a failed transaction itself: Kafka has no per-message nack.
func (k *kafkaBroker) franzMembers(ctx context.Context, e *runEnv, t *tracker, size, workers int, do func([]msg, *counts) error) (*counts, error) {
	var c counts
	members := make([]*kgo.Client, workers)
	for i := range members {
		cl, err := k.franzMember(e)
		if err != nil {
			for _, m := range members[:i] {
				m.Close()
			}
			return nil, err
		}
		members[i] = cl
	}
	defer func() {
		var wg sync.WaitGroup
		for _, m := range members {
			wg.Go(m.Close)
		}
		wg.Wait()
	}()
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for _, cl := range members {
		wg.Go(func() {
			ms := make([]msg, 0, size)
			for ctx.Err() == nil {
				fs := cl.PollRecords(ctx, size)
				if err := fs.Err0(); err != nil && ctx.Err() == nil {
					errc <- err
					return
				}
				rs := fs.Records()
				if len(rs) == 0 {
					continue
				}
				ms = ms[:0]
				for _, r := range rs {
					ms = append(ms, franzMsg(r))
				}
				if err := do(ms, &c); err != nil {
					return // ctx ended
				}
				for i := range ms {
					t.decided(ms[i].id, ms[i].ts)
				}
				t.batches.Add(1)
				if err := cl.CommitRecords(ctx, rs...); err != nil {
					if ctx.Err() == nil {
						errc <- fmt.Errorf("offset commit: %w", err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return &c, err
	default:
	}
	return &c, nil
}

// franzSeed is the seed pattern on franz-go: workers members, each taking
// one record at a time through one store transaction, then a synchronous
// commit of its offset.
func (k *kafkaBroker) franzSeed(ctx context.Context, e *runEnv, t *tracker, workers int) (*counts, error) {
	return k.franzMembers(ctx, e, t, 1, workers, func(ms []msg, c *counts) error {
		for {
			dup, err := e.store.seedTx(ctx, e, &ms[0])
			if err == nil {
				if dup {
					c.duplicates.Add(1)
				} else {
					c.processed.Add(1)
				}
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.retried.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// franzBatch is the hand-tuned batch consumer on franz-go: workers
// members, each taking up to size records a poll through one store
// transaction (batchTx), then one synchronous commit.
func (k *kafkaBroker) franzBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error) {
	return k.franzMembers(ctx, e, t, size, workers, func(ms []msg, c *counts) error {
		for {
			won, err := e.store.batchTx(ctx, e, ms)
			if err == nil {
				c.processed.Add(int64(won))
				c.duplicates.Add(int64(len(ms) - won))
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.retried.Add(int64(len(ms)))
			time.Sleep(10 * time.Millisecond)
		}
	})
}
