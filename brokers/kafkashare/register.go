package kafkashare

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core/driver"
)

// init registers kafka+share:// with core.OpenSource, and with
// admin.OpenDeadLetters: the parked copies are records of a Kafka topic
// with the kafka:// adapter's headers, so its dead-letter queue serves
// them. Publishing to a share group's topic is publishing to the topic:
// use kafka://.
func init() {
	driver.RegisterBroker(Scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		var opts []Option
		if cfg.Logger != nil {
			opts = append(opts, WithLogger(cfg.Logger))
		}
		return Open(ctx, u.String(), opts...)
	}, func(context.Context, *url.URL, driver.OpenConfig) (driver.Publisher, error) {
		return nil, errors.New("kafka+share URL: a share group only consumes; publish to the topic with a kafka:// URL")
	})
	admin.RegisterDeadLetters(Scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
		return OpenDeadLetters(ctx, u.String(), cfg.Logger)
	})
}

// OpenDeadLetters opens the dead letters a Source opened with the URL raw
// parks: those of its dead-letter topic, through the kafka:// adapter's
// dead-letter queue (kafka.OpenDeadLetters), which records what it
// redrove or purged under the consumer group "<group>.dlq-operator". A nil
// logger gives the default.
func OpenDeadLetters(ctx context.Context, raw string, logger *slog.Logger) (*kafka.DeadLetters, error) {
	c, err := resolve(raw, nil)
	if err != nil {
		return nil, err
	}
	q := url.Values{"group": {c.group}, "dead_letter_topic": {c.deadLetterTopic}}
	target := (&url.URL{Scheme: "kafka", Host: strings.Join(c.brokers, ","), Path: "/" + c.topic, RawQuery: q.Encode()}).String()
	var opts []kafka.Option
	if logger != nil {
		opts = append(opts, kafka.WithLogger(logger))
	}
	return kafka.OpenDeadLetters(ctx, target, opts...)
}
