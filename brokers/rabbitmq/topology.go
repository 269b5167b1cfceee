package rabbitmq

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// declare creates the topology for queue on its own channel (a failed
// declaration closes the channel it ran on), or, when declaring is off,
// checks passively that the queues the configured modes use exist.
//
// The main queue dead-letters through the default exchange straight to the
// dead-letter queue, and the retry queue dead-letters back to the main
// queue, so no exchange needs declaring or binding but the one producers
// publish to when WithExchange names one.
func declare(conn *amqp.Connection, queue string, cfg config) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer ch.Close()
	// Each queue is of the configured type and dead-letters to dlx ("" for
	// none), with the message TTL if ttl. Without declaring, the
	// dead-letter queue must exist only for DeadLetterRepublish: a
	// rejected message goes where the queue's own arguments send it.
	type spec struct {
		what, name, dlx string
		ttl             bool
		limit           int
	}
	queues := []spec{{"dead-letter queue", cfg.deadLetterQueue, "", true, 0}, {"queue", queue, cfg.deadLetterQueue, true, cfg.deliveryLimit}}
	if !cfg.declare && cfg.deadLetterMode != DeadLetterRepublish {
		queues = queues[1:]
	}
	if cfg.retryMode == RetryViaQueue {
		queues = append(queues, spec{"retry queue", cfg.retryQueue, queue, false, 0})
	}
	for _, q := range queues {
		if !cfg.declare {
			if _, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: %s %q must exist when WithDeclare(false): %w", q.what, q.name, err)
			}
			continue
		}
		args := amqp.Table{"x-queue-type": string(cfg.queueType)}
		if q.dlx != "" {
			args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = "", q.dlx
		}
		if q.ttl && cfg.messageTTL > 0 {
			args["x-message-ttl"] = cfg.messageTTL.Milliseconds()
		}
		if q.limit > 0 {
			args["x-delivery-limit"] = int64(q.limit)
		}
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, args); err != nil {
			return fmt.Errorf("rabbitmq: declare %s %q: %w%s", q.what, q.name, err, preconditionHint(err))
		}
	}
	if cfg.exchange == "" {
		return nil
	}
	if !cfg.declare {
		if err := ch.ExchangeDeclarePassive(cfg.exchange, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: exchange %q must exist when WithDeclare(false): %w", cfg.exchange, err)
		}
		return nil
	}
	// Declared as a durable direct exchange unless it exists, whatever its
	// type: declaring it again with another type would fail. A failed
	// passive declare closes its channel, so it runs on one of its own.
	probe, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := probe.ExchangeDeclarePassive(cfg.exchange, "direct", true, false, false, false, nil); err != nil {
		if err := ch.ExchangeDeclare(cfg.exchange, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declare exchange %q: %w", cfg.exchange, err)
		}
	} else {
		probe.Close()
	}
	if err := ch.QueueBind(queue, queue, cfg.exchange, false, nil); err != nil {
		return fmt.Errorf("rabbitmq: bind queue %q to exchange %q: %w", queue, cfg.exchange, err)
	}
	return nil
}

// preconditionHint explains a PRECONDITION_FAILED answer to a queue
// declaration: the queue exists with other arguments, which a declaration
// cannot change.
func preconditionHint(err error) string {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return ""
	}
	return " (the queue exists with other arguments (type, TTL, dead-lettering), which declaring cannot change: " +
		"use it as it is with declare=false, set a TTL with a policy and policy_ttl=, or delete the queue and let the Source declare it)"
}
