package outbox_test

import (
	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core/driver"
)

// The broker publishers a relay takes as they are, and the ones bound to a
// destination that go through outbox.Destinations.
var (
	_ driver.Publisher = (*rabbitmq.Publisher)(nil) // publisher confirms
	_ driver.Publisher = (*kafka.Publisher)(nil)    // acks=all
	_ driver.Publisher = (*memory.Broker)(nil)
	_ driver.Publisher = (*sqs.Publisher)(nil) // SendMessageBatch, one queue each
)
