package memory

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/internal/redact"
)

func init() { driver.RegisterBroker("mem", openSourceURL, openPublisherURL) }

var named = struct {
	sync.Mutex
	brokers map[string]*Broker
}{brokers: map[string]*Broker{}}

// Named returns the process-wide broker called name, creating it with opts
// on first use (later calls ignore opts). URLs of the form mem://QUEUE use
// the broker named "default"; mem://QUEUE?broker=NAME another one, so a
// publisher and a consumer opened by URL in one process meet on it.
func Named(name string, opts ...Option) (*Broker, error) {
	named.Lock()
	defer named.Unlock()
	if b, ok := named.brokers[name]; ok {
		return b, nil
	}
	b, err := NewBroker(opts...)
	if err != nil {
		return nil, err
	}
	named.brokers[name] = b
	return b, nil
}

// parseURL reads mem://QUEUE?broker=NAME&visibility=DURATION&window=N.
func parseURL(u *url.URL) (b *Broker, queue string, subOpts []SubscribeOption, err error) {
	queue = strings.Trim(u.Host+u.Path, "/")
	if queue == "" {
		return nil, "", nil, fmt.Errorf("mem URL has no queue name (use mem://payments)")
	}
	name := "default"
	var bopts []Option
	query, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, "", nil, fmt.Errorf("mem URL parameters: %w", err)
	}
	for k, vs := range query {
		v := vs[len(vs)-1]
		switch k {
		case "broker":
			name = v
		case "visibility":
			d, perr := time.ParseDuration(v)
			if perr != nil {
				return nil, "", nil, errors.New("mem URL parameter visibility: not a duration")
			}
			bopts = append(bopts, WithVisibilityTimeout(d))
		case "window":
			var n int
			if _, perr := fmt.Sscan(v, &n); perr != nil {
				return nil, "", nil, errors.New("mem URL parameter window: not a number")
			}
			subOpts = append(subOpts, WithWindow(n))
		default:
			return nil, "", nil, fmt.Errorf("mem URL: unknown parameter %q (known: broker, visibility, window)", redact.Name(k))
		}
	}
	b, err = Named(name, bopts...)
	return b, queue, subOpts, err
}

func openSourceURL(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
	b, queue, subOpts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return b.Subscribe(queue, subOpts...)
}

// Publisher publishes to a Broker's queues; it is what
// core.OpenPublisher returns for mem:// URLs.
type Publisher struct {
	b     *Broker
	queue string
}

// Publisher returns a driver.Publisher whose default destination is queue.
func (b *Broker) Publisher(queue string) *Publisher { return &Publisher{b: b, queue: queue} }

// Publish implements driver.Publisher: it publishes to queue, or to the
// default queue when queue is "".
func (p *Publisher) Publish(ctx context.Context, queue string, msgs ...*driver.Message) error {
	if queue == "" {
		queue = p.queue
	}
	return p.b.Publish(ctx, queue, msgs...)
}

// Close implements driver.Publisher; the broker stays open.
func (p *Publisher) Close() error { return nil }

func openPublisherURL(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
	b, queue, subOpts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	if len(subOpts) > 0 {
		return nil, fmt.Errorf("mem URL parameter window applies to consumers, not publishers")
	}
	return b.Publisher(queue), nil
}
