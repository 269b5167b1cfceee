package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
)

// BenchmarkRabbitToPostgres measures end-to-end deliveries per second from
// RabbitMQ into Postgres (an INSERT per message as the business effect),
// b.N deliveries of which one in six is a duplicate publish, for:
//
//   - seed: a plain amqp091-go + pgx consumer written as in seed 003: one
//     goroutine, prefetch 5, one transaction per message (dedup INSERT, on
//     unique violation rollback and ack; else effect, commit, ack);
//   - idemq-batch1: the same shape through idemq (batch 1, window 5);
//   - idemq-batch100: batches of 100, window 400, 2 concurrent batches.
//
// Run all three in one run, without -race:
//
//	go test -run '^$' -bench RabbitToPostgres -benchtime 5000x ./brokers/rabbitmq/
func BenchmarkRabbitToPostgres(b *testing.B) {
	amqpU := amqpURL(b)
	pgURL := postgresURL(b)
	b.Run("seed", func(b *testing.B) { benchRun(b, amqpU, pgURL, runSeed) })
	b.Run("idemq-batch1", func(b *testing.B) {
		benchRun(b, amqpU, pgURL, idemqRunner(core.WithBatchSize(1), core.WithWindow(5)))
	})
	b.Run("idemq-batch100", func(b *testing.B) {
		benchRun(b, amqpU, pgURL, idemqRunner(core.WithBatchSize(100), core.WithWindow(400), core.WithConcurrency(2)))
	})
}

// runner consumes total deliveries from queue into the effects table and
// returns when all are settled.
type runner func(b *testing.B, amqpU, pgURL, queue, effects string, total int)

func benchRun(b *testing.B, amqpU, pgURL string, run runner) {
	ctx := context.Background()
	q := uniqueQueue(b, amqpU)
	effects := "bench_effects_" + q[len("idemq-test-"):]
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects)

	s, err := Open(ctx, amqpU, q)
	if err != nil {
		b.Fatal(err)
	}
	s.Close()
	total := b.N
	msgs := make([]*core.Message, total)
	for i := range msgs {
		id := i
		if i%6 == 5 {
			id = i - 3 // a duplicate publish of a recent id
		}
		msgs[i] = &core.Message{ID: fmt.Sprintf("bench-%07d", id), Body: fmt.Appendf(nil, `{"n":%d}`, id)}
	}
	pub, err := NewPublisher(ctx, amqpU)
	if err != nil {
		b.Fatal(err)
	}
	if err := pub.Publish(ctx, q, msgs...); err != nil {
		b.Fatal(err)
	}
	pub.Close()

	b.ResetTimer()
	start := time.Now()
	run(b, amqpU, pgURL, q, effects, total)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")

	var rows, ids int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&rows, &ids); err != nil {
		b.Fatal(err)
	}
	if rows != ids {
		b.Fatalf("%d effects for %d ids: some applied twice", rows, ids)
	}
}

// runSeed is the seed-003 consumer.
func runSeed(b *testing.B, amqpU, pgURL, queue, effects string, total int) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	dedup := effects + "_seed_processed"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+dedup+` (message_id TEXT PRIMARY KEY, processed_at TIMESTAMPTZ NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+dedup)
	conn, err := amqp.Dial(amqpU)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(5, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	errDup := errors.New("duplicate")
	process := func(id string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+dedup+` (message_id, processed_at) VALUES ($1, now())`, id); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				return errDup
			}
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, id); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for done := 0; done < total; done++ {
		d := <-deliveries
		err := process(d.MessageId)
		switch {
		case err == nil, errors.Is(err, errDup):
			err = d.Ack(false)
		default:
			err = d.Nack(false, true)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

func idemqRunner(opts ...core.Option) runner {
	return func(b *testing.B, amqpU, pgURL, queue, effects string, total int) {
		ctx := context.Background()
		store, err := postgres.Open(ctx, pgURL, postgres.WithTable(effects+"_processed"))
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		defer store.Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`_processed`)
		src, err := Open(ctx, amqpU, queue)
		if err != nil {
			b.Fatal(err)
		}
		c, err := core.New[pgx.Tx](src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (id) VALUES ($1)`, m.ID)
			return err
		}, append([]core.Option{core.WithName("bench")}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var settled atomic.Bool
		for !settled.Load() {
			st := c.Stats()
			if st.Processed+st.Duplicates >= int64(total) {
				settled.Store(true)
				break
			}
			select {
			case err := <-done:
				b.Fatalf("Run stopped early: %v", err)
			case <-time.After(2 * time.Millisecond):
			}
		}
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSourceReceiveAck measures the adapter alone, no database:
// Receive b.N messages with a window of 400 and ack them 200 at a time
// with AckBatch (multiple ack), or one by one; "raw" is plain amqp091-go
// doing the same with a multiple ack every 200, for comparison.
func BenchmarkSourceReceiveAck(b *testing.B) {
	amqpU := amqpURL(b)
	b.Run("raw-amqp091-ack200", func(b *testing.B) {
		ctx := context.Background()
		q := uniqueQueue(b, amqpU)
		s, err := Open(ctx, amqpU, q)
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
		publishBench(b, amqpU, q, b.N)
		conn, err := amqp.Dial(amqpU)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Qos(400, 0, false); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 1; i <= b.N; i++ {
			d := <-deliveries
			if i%200 == 0 || i == b.N {
				if err := d.Ack(true); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	for _, batch := range []int{1, 200} {
		b.Run(fmt.Sprintf("ack%d", batch), func(b *testing.B) {
			ctx := context.Background()
			q := uniqueQueue(b, amqpU)
			src, err := Open(ctx, amqpU, q)
			if err != nil {
				b.Fatal(err)
			}
			defer src.Close()
			if err := src.SetWindow(400); err != nil {
				b.Fatal(err)
			}
			publishBench(b, amqpU, q, b.N)
			b.ResetTimer()
			start := time.Now()
			pending := make([]core.Delivery, 0, batch)
			for range b.N {
				d, err := src.Receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				pending = append(pending, d)
				if len(pending) == batch {
					if batch == 1 {
						err = d.Ack(ctx)
					} else {
						err = src.AckBatch(ctx, pending)
					}
					if err != nil {
						b.Fatal(err)
					}
					pending = pending[:0]
				}
			}
			if len(pending) > 0 {
				if err := src.AckBatch(ctx, pending); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

func publishBench(b *testing.B, amqpU, q string, n int) {
	msgs := make([]*core.Message, n)
	for i := range msgs {
		msgs[i] = &core.Message{ID: fmt.Sprintf("raw-%07d", i), Body: []byte(`{"n":1}`)}
	}
	pub, err := NewPublisher(context.Background(), amqpU)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(context.Background(), q, msgs...); err != nil {
		b.Fatal(err)
	}
}
