package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
)

// BenchmarkKafkaToPostgres measures end-to-end deliveries per second from
// Kafka (kfake in this process, or IDEMQ_KAFKA_URL) into Postgres (an
// INSERT per message as the business effect), b.N deliveries over four
// partitions of which one in six is a duplicate publish, for:
//
//   - seed: a plain kafka-go + pgx consumer in the seed style: a group
//     Reader, one transaction per message (dedup INSERT, on unique
//     violation rollback; else effect and commit), then a synchronous
//     offset commit of that message;
//   - idemq-batch1: the same through idemq (batch 1, window 5);
//   - idemq-batch100: batches of 100, window 400, 2 concurrent batches.
//
// Run all three in one run, without -race:
//
//	go test -run '^$' -bench KafkaToPostgres -benchtime 5000x ./brokers/kafka/
func BenchmarkKafkaToPostgres(b *testing.B) {
	pgURL := postgresURL(b)
	b.Run("seed", func(b *testing.B) { benchRun(b, pgURL, runSeed) })
	b.Run("idemq-batch1", func(b *testing.B) {
		benchRun(b, pgURL, idemqRunner(core.WithBatchSize(1), core.WithWindow(5)))
	})
	b.Run("idemq-batch100", func(b *testing.B) {
		benchRun(b, pgURL, idemqRunner(core.WithBatchSize(100), core.WithWindow(400), core.WithConcurrency(2)))
	})
}

// runner consumes total deliveries of topic into the effects table and
// returns when all are decided.
type runner func(b *testing.B, bs, pgURL, topic, effects string, total int)

func benchRun(b *testing.B, pgURL string, run runner) {
	ctx := context.Background()
	bs := brokers(b)
	topic := newTopic(b, bs, 4)
	effects := "kafka_bench_effects_" + randomHex(5)
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects)

	total := b.N
	msgs := make([]*core.Message, total)
	for i := range msgs {
		id := i
		if i%6 == 5 {
			id = i - 3 // a duplicate publish of a recent id
		}
		msgs[i] = &core.Message{ID: fmt.Sprintf("bench-%07d", id), Body: fmt.Appendf(nil, `{"n":%d}`, id)}
	}
	pub, err := NewPublisher(bs)
	if err != nil {
		b.Fatal(err)
	}
	if err := pub.Publish(ctx, topic, msgs...); err != nil {
		b.Fatal(err)
	}
	pub.Close()

	b.ResetTimer()
	start := time.Now()
	run(b, bs, pgURL, topic, effects, total)
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

// runSeed is the seed-style consumer.
func runSeed(b *testing.B, bs, pgURL, topic, effects string, total int) {
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
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           strings.Split(bs, ","),
		GroupID:           "seed-" + randomHex(4),
		Topic:             topic,
		MinBytes:          1,
		MaxBytes:          1 << 20,
		MaxWait:           100 * time.Millisecond,
		HeartbeatInterval: 250 * time.Millisecond,
	})
	defer r.Close()
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
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var id string
		for _, h := range m.Headers {
			if h.Key == DefaultIDHeader {
				id = string(h.Value)
			}
		}
		if err := process(id); err != nil && !errors.Is(err, errDup) {
			b.Fatal(err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
}

func idemqRunner(opts ...core.Option) runner {
	return func(b *testing.B, bs, pgURL, topic, effects string, total int) {
		ctx := context.Background()
		store, err := postgres.Open(ctx, pgURL, postgres.WithTable(effects+"_processed"))
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		defer store.Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`_processed`)
		src, err := Open(ctx, bs, WithTopic(topic), WithGroup("idemq-"+randomHex(4)))
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
		for {
			st := c.Stats()
			if st.Processed+st.Duplicates >= int64(total) {
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

// BenchmarkSourceReceiveAck measures the adapter alone: b.N messages over
// four partitions received and acked by one goroutine through AckBatch of
// 100, with commits batched by default, no database.
func BenchmarkSourceReceiveAck(b *testing.B) {
	bs := brokers(b)
	topic := newTopic(b, bs, 4)
	publishN(b, bs, topic, "rx", b.N, nil)
	s, err := Open(context.Background(), bs, WithTopic(topic), WithGroup("rx-"+randomHex(4)))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.SetWindow(400); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	batch := make([]core.Delivery, 0, 100)
	for i := 0; i < b.N; i++ {
		d, err := s.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, d)
		if len(batch) == cap(batch) || i == b.N-1 {
			if err := s.AckBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
