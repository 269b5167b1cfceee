package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The baselines below are what a team writes by hand on amqp091-go and
// pgx, without idemq. They are the yardsticks of issue 10's targets, so they
// are written to be good, not straw men: prepared statements (pgx caches
// them), ON CONFLICT DO NOTHING claims, sorted keys against deadlocks.

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

// runSeed is the seed article's consumer (seeds/003): for each message one
// transaction — claim with INSERT … ON CONFLICT DO NOTHING, the UPDATE,
// COMMIT — then ack; a lost claim rolls back and acks. workers goroutines
// share one channel with the given prefetch.
func runSeed(ctx context.Context, e *runEnv, t *tracker, prefetch, workers int) (*counts, error) {
	conn, ds, err := e.rabbit.rawChannel(e.queue, prefetch)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	claim := `INSERT INTO ` + e.dedupTable + ` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	update := `UPDATE ` + e.accountsTable + ` SET balance_cents = balance_cents + $1 WHERE account = $2`
	var c counts
	process := func(d *amqp.Delivery) (dup bool, err error) {
		var p payment
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return false, err
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		tag, err := tx.Exec(ctx, claim, e.consumer, d.MessageId)
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() == 0 {
			return true, nil // the deferred rollback ends it
		}
		if _, err := tx.Exec(ctx, update, p.AmountCents, p.Account); err != nil {
			return false, err
		}
		return false, tx.Commit(ctx)
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

// nextBatch takes one delivery (blocking) and then as many more as are
// already buffered, up to size: like idemq's batcher without linger, a
// batch fills up while the previous one is being processed.
func nextBatch(ctx context.Context, ds <-chan amqp.Delivery, buf []amqp.Delivery, size int) ([]amqp.Delivery, error) {
	buf = buf[:0]
	select {
	case d, ok := <-ds:
		if !ok {
			return nil, errors.New("delivery channel closed")
		}
		buf = append(buf, d)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(buf) < size {
		select {
		case d, ok := <-ds:
			if !ok {
				return buf, nil
			}
			buf = append(buf, d)
		default:
			return buf, nil
		}
	}
	return buf, nil
}

// runRawAck consumes and acknowledges with no database: a multiple ack per
// batch of up to size deliveries, prefetch 2 × size.
func runRawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	conn, raw, err := e.rabbit.rawChannel(e.queue, 2*size)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ds := pump(raw, 2*size)
	var c counts
	buf := make([]amqp.Delivery, 0, size)
	for {
		b, err := nextBatch(ctx, ds, buf, size)
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

// runHandBatch is the hand-tuned batch consumer: workers channels, each
// with prefetch 2 × size, each taking batches of up to size deliveries
// into one transaction: one multi-row claim of the batch's distinct ids
// (sorted, so concurrent batches lock keys in one order), the amounts of
// the ids won summed per account, one set-based UPDATE (accounts sorted),
// one commit, one multiple ack. A deadlock or serialization failure
// re-runs the transaction.
func runHandBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error) {
	claim := `INSERT INTO ` + e.dedupTable + ` (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS u(id) ORDER BY id
ON CONFLICT DO NOTHING RETURNING message_id`
	update := `UPDATE ` + e.accountsTable + ` a SET balance_cents = a.balance_cents + v.amt
FROM (SELECT unnest($1::text[]) AS acc, unnest($2::bigint[]) AS amt) v WHERE a.account = v.acc`
	var c counts
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		conn, raw, err := e.rabbit.rawChannel(e.queue, 2*size)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ds := pump(raw, 2*size)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]amqp.Delivery, 0, size)
			for {
				b, err := nextBatch(ctx, ds, buf, size)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				won, err := handBatchTx(ctx, e, b, claim, update)
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

// handBatchTx runs one batch's transaction, re-running it on a deadlock
// or serialization failure, and returns how many deliveries won a claim.
func handBatchTx(ctx context.Context, e *runEnv, b []amqp.Delivery, claim, update string) (int, error) {
	pays := make(map[string]payment, len(b))
	ids := make([]string, 0, len(b))
	for i := range b {
		id := b[i].MessageId
		if _, ok := pays[id]; ok {
			continue // the same id twice in one batch: claimed once
		}
		var p payment
		if err := json.Unmarshal(b[i].Body, &p); err != nil {
			return 0, err
		}
		pays[id] = p
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for attempt := 1; ; attempt++ {
		won, err := func() (int, error) {
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			rows, err := tx.Query(ctx, claim, e.consumer, ids)
			if err != nil {
				return 0, err
			}
			sums := map[string]int64{}
			won := 0
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return 0, err
				}
				p := pays[id]
				sums[p.Account] += p.AmountCents
				won++
			}
			if err := rows.Err(); err != nil {
				return 0, err
			}
			if won > 0 {
				accs := make([]string, 0, len(sums))
				for a := range sums {
					accs = append(accs, a)
				}
				slices.Sort(accs)
				amts := make([]int64, len(accs))
				for i, a := range accs {
					amts[i] = sums[a]
				}
				if _, err := tx.Exec(ctx, update, accs, amts); err != nil {
					return 0, err
				}
			}
			return won, tx.Commit(ctx)
		}()
		if err == nil {
			// Deliveries of an id seen twice in the batch count as
			// duplicates: only the first could win.
			return won, nil
		}
		var pe *pgconn.PgError
		if attempt < 5 && errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") {
			time.Sleep(time.Duration(attempt) * 5 * time.Millisecond)
			continue
		}
		return 0, fmt.Errorf("hand-batch transaction: %w", err)
	}
}
