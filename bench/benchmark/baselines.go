package benchmark

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The baselines are what a team writes by hand on the raw drivers
// (amqp091-go, kafka-go, aws-sdk-go-v2; pgx, go-sql-driver/mysql), without
// idemq. They are the yardsticks of the targets (Report.Ratios), so they are written
// to be good, not straw men: prepared or interpolated statements, claims
// that never raise a duplicate-key error, sorted keys against deadlocks.
// The broker side of each (this file for RabbitMQ, kafka.go, sqs.go) moves
// deliveries and acknowledgements; the store side (postgres.go, mysql.go)
// runs the transactions.

// counts are a consumer's decision counts.
type counts struct {
	processed, duplicates, retried, deadLettered atomic.Int64
	// stages is the time idemq spent in each store stage over the whole
	// run (idemq configurations only).
	stages map[string]time.Duration
}

func headerNanos(t amqp.Table) int64 {
	switch v := t[headerTS].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	}
	return 0
}

// rawChannel opens a connection and a channel with QoS prefetch consuming
// queue.
func (r *rabbit) rawChannel(queue string, prefetch int) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := amqp.Dial(r.rawURL)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(prefetch, 0, false)
	}
	var ds <-chan amqp.Delivery
	if err == nil {
		ds, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ds, nil
}

// pump moves deliveries into a channel buffered to the prefetch, so that
// a batch can take at once everything the broker already sent while the
// previous batch was being processed (amqp091-go hands deliveries over
// one by one on an unbuffered channel).
func pump(ds <-chan amqp.Delivery, prefetch int) <-chan amqp.Delivery {
	out := make(chan amqp.Delivery, prefetch)
	go func() {
		defer close(out)
		for d := range ds {
			out <- d
		}
	}()
	return out
}

// seed is the seed article's consumer (seeds/003): for each message one
// store transaction (claim, UPDATE, COMMIT), then ack; a lost claim rolls
// back and acks. workers goroutines share one channel with the given
// prefetch.
func (r *rabbit) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, workers int) (*counts, error) {
	conn, ds, err := r.rawChannel(e.queue, prefetch)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var c counts
	process := func(d *amqp.Delivery) (dup bool, err error) {
		return e.store.seedTx(ctx, e, &msg{id: d.MessageId, body: d.Body})
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				var d amqp.Delivery
				var ok bool
				select {
				case d, ok = <-ds:
				case <-ctx.Done():
					return
				}
				if !ok {
					errc <- errors.New("delivery channel closed")
					return
				}
				dup, err := process(&d)
				if err != nil {
					if ctx.Err() != nil {
						return // shutting down: left unacked for redelivery
					}
					c.retried.Add(1)
					d.Nack(false, true)
					continue
				}
				if dup {
					c.duplicates.Add(1)
				} else {
					c.processed.Add(1)
				}
				t.decided(d.MessageId, headerNanos(d.Headers)) // at the commit, before the ack
				t.batches.Add(1)
				if err := d.Ack(false); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		if ctx.Err() == nil {
			return &c, err
		}
	default:
	}
	return &c, nil
}

// rawAck consumes and acknowledges with no database: a multiple ack per
// batch of up to size deliveries, prefetch 4 × size (idemq's default window).
func (r *rabbit) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	conn, raw, err := r.rawChannel(e.queue, 4*size)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ds := pump(raw, 4*size)
	var c counts
	buf := make([]amqp.Delivery, 0, size)
	for {
		b, err := nextMsgs(ctx, ds, buf, size)
		if err != nil {
			if ctx.Err() != nil {
				return &c, nil
			}
			return &c, err
		}
		for i := range b {
			t.decided(b[i].MessageId, headerNanos(b[i].Headers))
		}
		c.processed.Add(int64(len(b)))
		t.batches.Add(1)
		if err := b[len(b)-1].Ack(true); err != nil {
			return &c, err
		}
	}
}

// handBatch is the hand-tuned batch consumer: workers channels, each with
// prefetch 4 × size (idemq's default window; at 2 × size it ran ~5%
// slower), each taking batches of up to size deliveries into one
// store transaction (the store's batchTx: one multi-row claim, one
// set-based UPDATE, one commit), then one multiple ack.
func (r *rabbit) handBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error) {
	var c counts
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		conn, raw, err := r.rawChannel(e.queue, 4*size)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ds := pump(raw, 4*size)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]amqp.Delivery, 0, size)
			ms := make([]msg, 0, size)
			for {
				b, err := nextMsgs(ctx, ds, buf, size)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				ms = ms[:0]
				for i := range b {
					ms = append(ms, msg{id: b[i].MessageId, body: b[i].Body})
				}
				won, err := e.store.batchTx(ctx, e, ms)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					c.retried.Add(int64(len(b)))
					b[len(b)-1].Nack(true, true)
					continue
				}
				c.processed.Add(int64(won))
				c.duplicates.Add(int64(len(b) - won))
				for i := range b {
					t.decided(b[i].MessageId, headerNanos(b[i].Headers))
				}
				t.batches.Add(1)
				if err := b[len(b)-1].Ack(true); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return &c, err
	default:
	}
	return &c, nil
}
