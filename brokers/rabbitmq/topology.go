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
	if !cfg.declare {
		names := []string{queue}
		if cfg.deadLetterMode == DeadLetterRepublish {
			names = append(names, cfg.deadLetterQueue)
		}
		if cfg.retryMode == RetryViaQueue {
			names = append(names, cfg.retryQueue)
		}
		for _, n := range names {
			if _, err := ch.QueueDeclarePassive(n, true, false, false, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: queue %q must exist when WithDeclare(false): %w", n, err)
			}
		}
		if cfg.exchange != "" {
			if err := ch.ExchangeDeclarePassive(cfg.exchange, "direct", true, false, false, false, nil); err != nil {
				return fmt.Errorf("rabbitmq: exchange %q must exist when WithDeclare(false): %w", cfg.exchange, err)
			}
		}
		return nil
	}
	typed := func(t amqp.Table) amqp.Table {
		t["x-queue-type"] = string(cfg.queueType)
		return t
	}
	dlqArgs := typed(amqp.Table{})
	if cfg.messageTTL > 0 {
		dlqArgs["x-message-ttl"] = cfg.messageTTL.Milliseconds()
	}
	if _, err := ch.QueueDeclare(cfg.deadLetterQueue, true, false, false, false, dlqArgs); err != nil {
		return fmt.Errorf("rabbitmq: declare dead-letter queue %q: %w%s", cfg.deadLetterQueue, err, preconditionHint(err))
	}
	mainArgs := typed(amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": cfg.deadLetterQueue,
	})
	if cfg.deliveryLimit > 0 {
		mainArgs["x-delivery-limit"] = int64(cfg.deliveryLimit)
	}
	if cfg.messageTTL > 0 {
		mainArgs["x-message-ttl"] = cfg.messageTTL.Milliseconds()
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, mainArgs); err != nil {
		return fmt.Errorf("rabbitmq: declare queue %q: %w%s", queue, err, preconditionHint(err))
	}
	if cfg.retryMode == RetryViaQueue {
		if _, err := ch.QueueDeclare(cfg.retryQueue, true, false, false, false, typed(amqp.Table{
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": queue,
		})); err != nil {
			return fmt.Errorf("rabbitmq: declare retry queue %q: %w%s", cfg.retryQueue, err, preconditionHint(err))
		}
	}
	if cfg.exchange != "" {
		return bindExchange(conn, ch, queue, cfg.exchange)
	}
	return nil
}

// bindExchange declares exchange as a durable direct exchange unless it
// exists (whatever its type: declaring it again with another type would
// fail) and binds queue to it with the queue's name as key, the routing key
// a Publisher opened by the same URL sends with.
func bindExchange(conn *amqp.Connection, ch *amqp.Channel, queue, exchange string) error {
	probe, err := conn.Channel() // a failed passive declare closes its channel
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := probe.ExchangeDeclarePassive(exchange, "direct", true, false, false, false, nil); err != nil {
		if err := ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("rabbitmq: declare exchange %q: %w", exchange, err)
		}
	} else {
		probe.Close()
	}
	if err := ch.QueueBind(queue, queue, exchange, false, nil); err != nil {
		return fmt.Errorf("rabbitmq: bind queue %q to exchange %q: %w", queue, exchange, err)
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
