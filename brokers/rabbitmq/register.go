package rabbitmq

import (
	"context"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("amqp", openSourceURL, openPublisherURL)
	driver.RegisterBroker("amqps", openSourceURL, openPublisherURL)
}

func openSourceURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (core.Source, error) {
	return OpenURL(ctx, u.String())
}

// openPublisherURL opens amqp://…?queue=NAME[&exchange=NAME] for
// publishing: messages go to exchange (default: the default exchange) with
// routing key queue. Consumer-only parameters are accepted and ignored, so
// one URL serves both sides.
func openPublisherURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (core.Publisher, error) {
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: url parameters: %w", err)
	}
	exchange := q.Get("exchange")
	q.Del("exchange")
	rest := *u
	rest.RawQuery = q.Encode()
	amqpURL, queue, _, err := parseSourceURL(rest.String())
	if err != nil {
		return nil, err
	}
	opts := []PublisherOption{WithRoutingKey(queue)}
	if exchange != "" {
		opts = append(opts, WithPublishExchange(exchange))
	}
	p, err := NewPublisher(ctx, amqpURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: publisher: %w", err)
	}
	return p, nil
}
