package sqs_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/postgres"
)

// Consume an SQS queue into Postgres: each order's effect is committed once,
// whatever SQS redelivers.
func ExampleOpen() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// The queue's redrive policy names the dead-letter queue; against AWS,
	// the default credential chain and region apply.
	src, err := sqs.Open(ctx, "sqs://orders")
	if err != nil {
		log.Fatal(err)
	}
	store, err := postgres.Open(ctx, "postgres://app@db/orders")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err := core.New(src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		_, err := tx.Exec(ctx, `UPDATE orders SET paid = true WHERE id = $1`, m.ID)
		return err
	}, core.WithName("billing"), core.WithBatchSize(10), core.WithConcurrency(2))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Point the adapter at a local emulator with static credentials, and keep a
// slow handler's messages hidden for up to 15 minutes.
func ExampleOpen_emulator() {
	ctx := context.Background()
	src, err := sqs.Open(ctx, "sqs://orders",
		sqs.WithEndpoint("http://127.0.0.1:9324"),
		sqs.WithStaticCredentials("test", "test", ""),
		sqs.WithDeadLetterQueue("orders-dlq"),
		sqs.WithMaxExtension(15*time.Minute),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
}

// Send messages with their business ids; on a FIFO queue Key is the
// message group.
func ExampleNewPublisher() {
	ctx := context.Background()
	pub, err := sqs.NewPublisher(ctx, "sqs://orders.fifo")
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(ctx, "",
		&driver.Message{ID: "order-1001", Key: "customer-7", Body: []byte(`{"total":42}`)},
		&driver.Message{ID: "order-1002", Key: "customer-7", Body: []byte(`{"total":17}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
}

// Choose the broker by configuration: the sqs package registers sqs://.
func Example_openByURL() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "sqs://test:test@orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq")
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
}

// List the dead letters of the orders consumer, then put back on its queue
// the ones a since-fixed bug rejected, and delete the malformed ones.
func ExampleOpenDeadLetters() {
	ctx := context.Background()
	dlq, err := sqs.OpenDeadLetters(ctx, "sqs://orders", sqs.WithDeadLetterQueue("orders-dlq"))
	if err != nil {
		log.Fatal(err)
	}
	defer dlq.Close()
	err = dlq.Scan(ctx, func(p *admin.Parked) error {
		log.Printf("%s (attempt %d, parked %v): %s", p.ID, p.Attempt, p.ParkedAt, p.Cause)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	n, err := dlq.Redrive(ctx, func(p *admin.Parked) bool {
		return strings.Contains(p.Cause, "currency not supported")
	}, func(done int) { log.Printf("%d redriven", done) })
	if err != nil {
		log.Fatalf("redrove %d, then: %v", n, err)
	}
	purged, err := dlq.Purge(ctx, func(p *admin.Parked) bool { return strings.Contains(p.Cause, "malformed") })
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("redriven %d, purged %d", n, purged)
}
