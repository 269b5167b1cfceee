package rabbitmq

import (
	"context"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	core.RegisterBroker("amqp", openSourceURL, openPublisherURL)
	core.RegisterBroker("amqps", openSourceURL, openPublisherURL)
}

func openSourceURL(ctx context.Context, u *url.URL) (core.Source, error) {
	return OpenURL(ctx, u.String())
}

// QueuePublisher publishes to one routing key (a queue, on the default
// exchange) with publisher confirms; it is what core.OpenPublisher returns
// for amqp:// URLs.
type QueuePublisher struct {
	*Publisher
	key string
}

// Publish implements core.Publisher.
func (p *QueuePublisher) Publish(ctx context.Context, msgs ...*core.Message) error {
	return p.Publisher.Publish(ctx, p.key, msgs...)
}

// openPublisherURL opens amqp://…?queue=NAME[&exchange=NAME] for
// publishing: messages go to exchange (default: the default exchange) with
// routing key queue. Consumer-only parameters are accepted and ignored, so
// one URL serves both sides.
func openPublisherURL(ctx context.Context, u *url.URL) (core.Publisher, error) {
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
	var opts []PublisherOption
	if exchange != "" {
		opts = append(opts, WithPublishExchange(exchange))
	}
	p, err := NewPublisher(ctx, amqpURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: publisher: %w", err)
	}
	return &QueuePublisher{Publisher: p, key: queue}, nil
}
