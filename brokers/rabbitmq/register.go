package rabbitmq

import (
	"context"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core"
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
	amqpURL, queue, _, err := parseSourceURL(withoutParam(u, "exchange").String())
	if err != nil {
		return nil, err
	}
	var opts []PublisherOption
	if ex := u.Query().Get("exchange"); ex != "" {
		opts = append(opts, WithPublishExchange(ex))
	}
	p, err := NewPublisher(ctx, amqpURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: publisher: %w", err)
	}
	return &QueuePublisher{Publisher: p, key: queue}, nil
}

func withoutParam(u *url.URL, name string) *url.URL {
	c := *u
	q := c.Query()
	q.Del(name)
	c.RawQuery = q.Encode()
	return &c
}
