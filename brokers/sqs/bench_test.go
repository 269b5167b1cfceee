package sqs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
)

// BenchmarkSQSToPostgres measures end-to-end messages per second from SQS
// into Postgres (an INSERT per message as the business effect), b.N
// messages of which one in six is a duplicate send, for:
//
//   - seed: a plain aws-sdk-go-v2 + pgx consumer written as in the seed
//     articles: one ReceiveMessage of one message, one transaction (dedup
//     INSERT; on a unique violation roll back and delete; else the effect
//     and commit), one DeleteMessage, one message at a time;
//   - idemq-batch1: the same shape through idemq (batch 1, window 5);
//   - idemq-batch10: batches of 10 (one claim, one commit, one
//     DeleteMessageBatch), window 40, 2 concurrent batches.
//
// All three run in one run, against the same endpoint:
//
//	go test -run '^$' -bench SQSToPostgres -benchtime 2000x ./brokers/sqs/
func BenchmarkSQSToPostgres(b *testing.B) {
	ep := sqsEndpoint(b)
	pg := postgresURL(b)
	b.Run("seed", func(b *testing.B) { benchRun(b, ep, pg, runSeed) })
	b.Run("idemq-batch1", func(b *testing.B) {
		benchRun(b, ep, pg, idemqRunner(core.WithBatchSize(1), core.WithWindow(5)))
	})
	b.Run("idemq-batch10", func(b *testing.B) {
		benchRun(b, ep, pg, idemqRunner(core.WithBatchSize(10), core.WithWindow(40), core.WithConcurrency(2)))
	})
}

// runner consumes total messages from the queue into the effects table and
// returns once all are settled.
type runner func(b *testing.B, ep, pg string, q testQueue, effects string, total int)

func benchRun(b *testing.B, ep, pg string, run runner) {
	ctx := context.Background()
	q, _ := newQueueWithDLQ(b, ep, false, 30, 0)
	effects := "sqs_bench_effects_" + randomHex(4)
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (id TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+effects)
	total := b.N
	ms := make([]*core.Message, total)
	for i := range ms {
		id := i
		if i%6 == 5 {
			id = i - 3 // a duplicate send of a recent id
		}
		ms[i] = &core.Message{ID: fmt.Sprintf("bench-%07d", id), Body: fmt.Appendf(nil, `{"n":%d}`, id)}
	}
	if err := publisher(b, ep, q).Publish(ctx, ms...); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	run(b, ep, pg, q, effects, total)
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

// runSeed is the seed-pattern consumer.
func runSeed(b *testing.B, ep, pg string, q testQueue, effects string, total int) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	dedup := effects + "_seed_processed"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+dedup+` (message_id TEXT PRIMARY KEY, processed_at TIMESTAMPTZ NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+dedup)
	cl := testClient(ep)
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
	for done := 0; done < total; {
		out, err := cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(q.url), MaxNumberOfMessages: 1, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{DefaultIDAttribute},
		})
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range out.Messages {
			err := process(attr(m, DefaultIDAttribute))
			switch {
			case err == nil, errors.Is(err, errDup):
				_, err = cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(q.url), ReceiptHandle: m.ReceiptHandle})
			default:
				_, err = cl.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(q.url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
				done-- // it comes back
			}
			if err != nil {
				b.Fatal(err)
			}
			done++
		}
	}
}

func idemqRunner(opts ...core.Option) runner {
	return func(b *testing.B, ep, pg string, q testQueue, effects string, total int) {
		ctx := context.Background()
		store, err := postgres.Open(ctx, pg, postgres.WithTable(effects+"_processed"))
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		defer store.Pool().Exec(context.Background(), `DROP TABLE IF EXISTS `+effects+`_processed`)
		src, err := Open(ctx, q.url, append(clientOpts(ep), WithDeadLetterQueue(q.url), WithWaitTime(time.Second))...)
		if err != nil {
			b.Fatal(err)
		}
		c, err := core.New(core.Source(src), core.Store[pgx.Tx](store), func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
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
		st := src.Stats()
		b.ReportMetric(float64(st.ReceiveCalls)/float64(total), "receives/msg")
		b.ReportMetric(float64(st.DeleteCalls)/float64(total), "deletes/msg")
	}
}
