package nats_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/nats"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// Consume the ORDERS stream into SQLite with the durable consumer
// "billing": each order's effect is committed once, whatever JetStream
// redelivers. The stream, its dead-letter stream ORDERS_DLQ and the
// consumer are created when missing.
func ExampleOpen() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	src, err := nats.Open(ctx, "nats://127.0.0.1:4222/ORDERS?consumer=billing&subject=orders.created",
		nats.WithMaxExtension(15*time.Minute), // slow handlers keep their lease this long
	)
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "billing.db")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `UPDATE orders SET paid = 1 WHERE id = ?`, m.ID)
		return err
	}, core.WithName("billing"), core.WithBatchSize(10))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// The same consumer chosen by configuration: a nats:// URL, here with a
// user and password, a private CA and a shorter AckWait.
func ExampleOpen_url() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "nats://billing:secret@nats-1:4222,nats-2:4222/ORDERS"+
		"?consumer=billing&subject=orders.created&ack_wait=10s&tls_ca=/etc/nats/ca.pem")
	if err != nil {
		log.Fatal(err) // the error shows no password
	}
	defer src.Close()
}

// Publish with the business id in Nats-Msg-Id: JetStream drops a retried
// publish within the stream's duplicate window, and the consumer's dedup
// store catches any later copy. Publish returns once JetStream acked every
// message.
func ExampleNewPublisher() {
	ctx := context.Background()
	p, err := nats.NewPublisher(ctx, "nats://127.0.0.1:4222/ORDERS", nats.WithSubject("orders.created"))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	err = p.Publish(ctx, "", &driver.Message{ID: "order-1042", Key: "customer-7", Body: []byte(`{"total":42}`)})
	if err != nil {
		log.Fatal(err)
	}
}

// A producer that knows nothing of idemq: nats.go alone, the id in
// Nats-Msg-Id, which the Source reads by default.
func ExampleNewPublisher_plainNATS() {
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	_, err = js.Publish(context.Background(), "orders.created", []byte(`{"total":42}`), jetstream.WithMsgID("order-1042"))
	if err != nil {
		log.Fatal(err)
	}
}

// After a fix is deployed, put the orders a bad deploy parked back on
// their subject; the consumer decides any already applied Duplicate.
func ExampleOpenDeadLetters() {
	ctx := context.Background()
	q, err := nats.OpenDeadLetters(ctx, "nats://127.0.0.1:4222/ORDERS?consumer=billing&subject=orders.created")
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	err = q.Scan(ctx, func(p *admin.Parked) error {
		fmt.Println(p.Ref, p.ID, p.Attempt, p.Cause)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	n, err := q.Redrive(ctx, func(p *admin.Parked) bool { return p.Cause != "" }, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redriven:", n)
}
