package rabbitmq_test

import (
	"context"
	"log"

	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core"
)

// Producers that cannot set the message_id property (amqp-tools'
// amqp-publish, MassTransit, NServiceBus) carry the id in a header: name it,
// in the URL or as an option. One URL with exchange= serves the publisher
// and the consumer alike.
func ExampleWithIDHeader() {
	ctx := context.Background()
	url := "amqp://guest:guest@localhost:5672/?queue=payments&exchange=billing&id_header=MessageId"
	src, err := core.OpenSource(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	pub, err := core.OpenPublisher(ctx, url) // writes the id to MessageId and message_id
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// The same from code.
	src2, err := rabbitmq.Open(ctx, "amqp://guest:guest@localhost:5672/", rabbitmq.WithQueue("payments"),
		rabbitmq.WithExchange("billing"), rabbitmq.WithIDHeader("NServiceBus.MessageId"))
	if err != nil {
		log.Fatal(err)
	}
	defer src2.Close()
}
