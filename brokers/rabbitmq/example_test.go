package rabbitmq_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"strings"
	"syscall"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// A consumer of the "payments" queue whose effects are applied exactly once:
// the handler writes in the same SQLite transaction that claims the
// message's AMQP message_id, and the delivery is acked after the commit.
func ExampleOpen() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// Declares payments (quorum), payments.dlq and payments.retry.
	src, err := rabbitmq.Open(ctx, "amqp://guest:guest@127.0.0.1:5672/?queue=payments",
		rabbitmq.WithQueueType(rabbitmq.Quorum),
		rabbitmq.WithRetryMode(rabbitmq.RetryViaQueue))
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "payments.db")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	c, err := core.New[*sql.Tx](src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, body) VALUES (?, ?)`, m.ID, m.Body)
		return err
	}, core.WithName("payments"), core.WithBatchSize(100), core.WithWindow(400))
	if err != nil {
		log.Fatal(err)
	}
	// Run sets the queue's prefetch to the window, and closes src when ctx
	// is cancelled and in-flight messages are settled.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Publishing with publisher confirms: Publish returns once the broker has
// every message. The id becomes the AMQP message_id the consumer dedups on.
func ExamplePublisher() {
	ctx := context.Background()
	pub, err := rabbitmq.NewPublisher(ctx, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, "payments",
		&driver.Message{ID: "payment-1001", Body: []byte(`{"amount":42}`), Headers: map[string]string{"traceparent": "00-…"}},
		&driver.Message{ID: "payment-1002", Body: []byte(`{"amount":7}`)})
	if err != nil {
		log.Fatal(err) // retry the call: the consumer's dedup absorbs copies
	}
}

// The whole configuration can come from one URL, so operators switch
// queues, queue types and settlement modes without a code change.
func ExampleOpen_url() {
	ctx := context.Background()
	src, err := rabbitmq.Open(ctx, "amqp://guest:guest@127.0.0.1:5672/?queue=payments&queue_type=quorum&retry=queue")
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
}

// An operator's endpoint over the payments consumer's dead letters: list
// them, put back the ones a bad deploy parked, delete the rest.
func ExampleOpenDeadLetters() {
	ctx := context.Background()
	dlq, err := rabbitmq.OpenDeadLetters(ctx, "amqp://guest:guest@127.0.0.1:5672/?queue=payments")
	if err != nil {
		log.Fatal(err)
	}
	defer dlq.Close()
	err = dlq.Scan(ctx, func(p *admin.Parked) error {
		log.Printf("%s %s parked %v from %s: %s", p.Ref, p.ID, p.ParkedAt, p.Origin, p.Cause)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	badDeploy := func(p *admin.Parked) bool { return strings.Contains(p.Cause, "schema v7") }
	n, err := dlq.Redrive(ctx, badDeploy, func(done int) { log.Printf("%d redriven", done) })
	if err != nil {
		log.Fatalf("redrove %d, then: %v", n, err) // the rest are still parked
	}
	if _, err := dlq.Purge(ctx, func(p *admin.Parked) bool { return !badDeploy(p) }); err != nil {
		log.Fatal(err)
	}
}
