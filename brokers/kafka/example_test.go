package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/sqlite"
)

// A member of the "billing" group consuming "payments", whose effects are
// applied exactly once: the handler writes in the same Postgres
// transaction that claims the message-id header, and the offset is marked
// after the commit (and committed, batched, once every earlier offset of
// the partition is decided too).
func ExampleOpen() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	src, err := kafka.Open(ctx, "kafka://127.0.0.1:9092/payments?group=billing",
		kafka.WithRevokeTimeout(5*time.Second), // in-flight work gets 5s when a rebalance revokes partitions
		kafka.WithIDHeader("ce_id"))            // CloudEvents' Kafka binding carries the id here
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	c, err := core.New[pgx.Tx](src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, len(m.Body), m.Key)
		return err
	}, core.WithName("billing"), core.WithBatchSize(100), core.WithWindow(400), core.WithConcurrency(2))
	if err != nil {
		log.Fatal(err)
	}
	// Run closes src when ctx is cancelled and in-flight messages are
	// settled; closing commits the decided offsets and leaves the group.
	// (A replica of a StatefulSet would add instance_id=$(POD_NAME) to
	// the URL: a restart then moves no partition; see WithInstanceID.)
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Publishing with acks=all: Publish returns once every in-sync replica
// has every message. The id goes to the message-id header, the key picks
// the partition (and so the order), and the trace context of ctx travels
// in the headers.
func ExampleNewPublisher() {
	ctx := context.Background()
	pub, err := kafka.NewPublisher(ctx, "kafka://127.0.0.1:9092")
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, "payments",
		&driver.Message{ID: "payment-1001", Key: "acct-7", Body: []byte(`{"amount":42}`)},
		&driver.Message{ID: "payment-1002", Key: "acct-7", Body: []byte(`{"amount":7}`)})
	if err != nil {
		log.Fatal(err) // retry the call: the consumer's dedup absorbs copies
	}
}

// End to end on a Kafka cluster: a payment published twice is applied
// once; the copy is a Duplicate.
func Example_duplicatePublish() {
	ctx := context.Background()
	// The cluster's host:port list and a topic (with its dead-letter
	// topic, topic.dlq) nothing has written to yet. Here: the cluster
	// IDEMQ_KAFKA_URL names, or bench/cmd/kfake, an in-memory Kafka.
	brokers, topic, stop := exampleCluster()
	defer stop()

	pub, err := kafka.NewPublisher(ctx, "kafka://"+brokers)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	payment := &driver.Message{ID: "payment-1001", Key: "acct-7", Body: []byte(`{"amount":42}`)}
	if err := pub.Publish(ctx, topic, payment, payment); err != nil { // a producer retry
		log.Fatal(err)
	}

	dir, _ := os.MkdirTemp("", "idemq-example")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "payments.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().Exec(`CREATE TABLE ledger (id TEXT, body TEXT)`); err != nil {
		log.Fatal(err)
	}
	src, err := kafka.Open(ctx, "kafka://"+brokers+"/"+topic+"?group=billing",
		kafka.WithStart(kafka.StartFirst))
	if err != nil {
		log.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (?, ?)`, m.ID, string(m.Body))
		return err
	}, core.WithName("billing"))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for st := c.Stats(); st.Processed+st.Duplicates < 2; st = c.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var rows int
	store.DB().QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows)
	st := c.Stats()
	fmt.Printf("processed %d, duplicates %d, ledger rows %d\n", st.Processed, st.Duplicates, rows)
	// Output: processed 1, duplicates 1, ledger rows 1
}

// An operator's look at the dead letters the "billing" group parked in
// "payments.dlq", after the fix is deployed: the ones a bad deploy parked
// go back to "payments" (each consumer group of the topic receives them;
// those that applied one already decide it Duplicate), and the rest are
// listed and stay parked.
func ExampleOpenDeadLetters() {
	ctx := context.Background()
	q, err := kafka.OpenDeadLetters(ctx, "kafka://127.0.0.1:9092/payments?group=billing")
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()

	n, err := q.Redrive(ctx, func(p *admin.Parked) bool {
		return strings.Contains(p.Cause, "schema v7")
	}, func(done int) { fmt.Printf("\rredriven %d", done) })
	if err != nil {
		log.Fatalf("redrove %d, then: %v", n, err)
	}
	err = q.Scan(ctx, func(p *admin.Parked) error {
		fmt.Printf("%s %s attempt %d parked %v: %s\n", p.Ref, p.ID, p.Attempt, p.ParkedAt.Format(time.RFC3339), p.Cause)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A Consumer of a share group, opened by URL: many members read each
// partition, the broker locks each record it hands out, and a retry is
// released back to the group once the Consumer's backoff passed.
func ExampleOpenShare() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "kafka+share://localhost:9092/payments?group=payments")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "/var/lib/app/dedup.db")
	if err != nil {
		log.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (payment_id, body) VALUES (?, ?)", m.ID, m.Body)
		return err
	}, core.WithName("payments"))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(ctx))
}
