package outbox_test

import (
	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/outbox"
)

// The broker publishers a relay takes as they are, and the ones bound to a
// destination that go through outbox.Destinations.
var (
	_ outbox.Publisher = (*rabbitmq.Publisher)(nil) // publisher confirms
	_ outbox.Publisher = (*kafka.Publisher)(nil)    // acks=all
	_ outbox.Publisher = (*memory.Broker)(nil)
	_ core.Publisher   = (*sqs.Publisher)(nil) // SendMessageBatch, one queue each
)
