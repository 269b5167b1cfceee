package kafka

import (
	"context"
	"errors"
	"net/url"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/admin"
)

// Importing this package registers the kafka:// scheme, so that
// core.OpenSource, core.OpenPublisher and admin.OpenDeadLetters open Kafka
// from configuration:
//
//	kafka://127.0.0.1:9092/payments?group=billing
func init() {
	driver.RegisterBroker("kafka", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("kafka", openDeadLettersURL)
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	return Open(ctx, u.String(), loggerOption(cfg))
}

func openPublisherURL(_ context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	p, err := NewPublisher(u.String(), loggerOption(cfg))
	if err != nil {
		return nil, err
	}
	if p.cfg.topic == "" {
		p.Close()
		return nil, errors.New("kafka: url: no topic to publish to (kafka://host:port/topic)")
	}
	return p, nil
}

// loggerOption is WithLogger of the service's adapter logger, nil (no
// option) when it gave none.
func loggerOption(cfg driver.OpenConfig) Option {
	if cfg.Logger == nil {
		return nil
	}
	return WithLogger(cfg.Logger)
}
