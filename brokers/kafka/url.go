package kafka

import (
	"context"
	"errors"
	"net/url"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// Importing this package registers the kafka:// scheme, so that
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters open Kafka
// from configuration:
//
//	kafka://127.0.0.1:9092/payments?group=billing
func init() {
	driver.RegisterBroker("kafka", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), loggerOption(cfg))
	}, openPublisherURL)
	admin.RegisterDeadLetters("kafka", func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
		return OpenDeadLetters(ctx, u.String(), loggerOption(cfg))
	})
}

func openPublisherURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	p, err := NewPublisher(ctx, u.String(), loggerOption(cfg))
	if err != nil {
		return nil, err
	}
	if p.cfg.topic == "" {
		p.Close()
		return nil, errors.New("kafka URL: no topic to publish to (kafka://host:port/topic)")
	}
	return p, nil
}

// loggerOption is WithLogger of the service's adapter logger, nil (no
// option) when it gave none.
func loggerOption(cfg driver.OpenConfig) PublisherOption {
	if cfg.Logger == nil {
		return nil
	}
	return WithLogger(cfg.Logger)
}
