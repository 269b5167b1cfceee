package rabbitmq

import (
	"context"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/admin"
)

func init() {
	driver.RegisterBroker("amqp", openSourceURL, openPublisherURL)
	driver.RegisterBroker("amqps", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("amqp", openDeadLettersURL)
	admin.RegisterDeadLetters("amqps", openDeadLettersURL)
}

// openSourceURL opens amqp://…?queue=NAME[&…] (see OpenURL) for consuming,
// logging to cfg.Logger when it is given.
func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	var opts []Option
	if cfg.Logger != nil {
		opts = append(opts, WithLogger(cfg.Logger))
	}
	return OpenURL(ctx, u.String(), opts...)
}

// openPublisherURL opens amqp://…?queue=NAME[&exchange=NAME][&id_header=NAME]
// for publishing: messages go to exchange (default: the default exchange)
// with routing key queue, their id also in the id_header when one is named.
// The URL is checked as OpenURL checks it, and the other consumer
// parameters are accepted and ignored, so one URL serves both sides. The
// Publisher does not log, so cfg.Logger has nothing to reach.
func openPublisherURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
	amqpURL, queue, urlOpts, err := parseSourceURL(u.String())
	if err != nil {
		return nil, err
	}
	cfg, _, err := sourceConfig(amqpURL, queue, urlOpts)
	if err != nil {
		return nil, err
	}
	opts := []PublisherOption{WithRoutingKey(queue), WithPublishExchange(cfg.exchange)}
	if cfg.idHeader != "" {
		opts = append(opts, WithPublisherIDHeader(cfg.idHeader))
	}
	p, err := NewPublisher(ctx, amqpURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: publisher: %w", err)
	}
	return p, nil
}
