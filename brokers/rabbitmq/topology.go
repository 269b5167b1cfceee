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
	// queueDeclare declares a queue of the configured type that
	// dead-letters to dlx ("" for none), with the message TTL if ttl.
	queueDeclare := func(what, name, dlx string, ttl bool, limit int) error {
		args := amqp.Table{"x-queue-type": string(cfg.queueType)}
		if dlx != "" {
			args["x-dead-letter-exchange"], args["x-dead-letter-routing-key"] = "", dlx
		}
		if ttl && cfg.messageTTL > 0 {
			args["x-message-ttl"] = cfg.messageTTL.Milliseconds()
		}
		if limit > 0 {
			args["x-delivery-limit"] = int64(limit)
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			return fmt.Errorf("rabbitmq: declare %s %q: %w%s", what, name, err, preconditionHint(err))
		}
		return nil
	}
	if err := queueDeclare("dead-letter queue", cfg.deadLetterQueue, "", true, 0); err != nil {
		return err
	}
	if err := queueDeclare("queue", queue, cfg.deadLetterQueue, true, cfg.deliveryLimit); err != nil {
		return err
	}
	if cfg.retryMode == RetryViaQueue {
		if err := queueDeclare("retry queue", cfg.retryQueue, queue, false, 0); err != nil {
			return err
		}
	}
	if cfg.exchange == "" {
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
