package kafka

import (
	"context"
	"errors"
	"net/url"

	"github.com/idemq/idemq/core"
)

// Importing this package registers the kafka:// scheme, so that
// core.OpenSource and core.OpenPublisher open Kafka from configuration:
//
//	kafka://127.0.0.1:9092/payments?group=billing
func init() { core.RegisterBroker("kafka", openSourceURL, openPublisherURL) }

func openSourceURL(ctx context.Context, u *url.URL) (core.Source, error) {
	return Open(ctx, u.String())
}

func openPublisherURL(_ context.Context, u *url.URL) (core.Publisher, error) {
	p, err := NewPublisher(u.String())
	if err != nil {
		return nil, err
	}
	if p.cfg.topic == "" {
		p.Close()
		return nil, errors.New("kafka: url: no topic to publish to (kafka://host:port/topic)")
	}
	return &TopicPublisher{p: p, topic: p.cfg.topic, owned: true}, nil
}

// TopicPublisher publishes to one topic; it implements core.Publisher and
// is what core.OpenPublisher returns for kafka:// URLs.
type TopicPublisher struct {
	p     *Publisher
	topic string
	owned bool
}

// To returns a core.Publisher for topic that shares p's writer; closing it
// leaves p open.
func (p *Publisher) To(topic string) *TopicPublisher {
	return &TopicPublisher{p: p, topic: topic}
}

// Publish implements core.Publisher.
func (t *TopicPublisher) Publish(ctx context.Context, msgs ...*core.Message) error {
	return t.p.Publish(ctx, t.topic, msgs...)
}

// Close closes the underlying Publisher if this TopicPublisher was opened
// by URL (it owns it), and does nothing otherwise.
func (t *TopicPublisher) Close() error {
	if t.owned {
		return t.p.Close()
	}
	return nil
}
