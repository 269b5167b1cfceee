package memory

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
)

func init() {
	driver.RegisterSource("mem", openSourceURL)
	driver.RegisterPublisher("mem", openPublisherURL)
}

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

// urlParams are the parameters of mem:// URLs; broker names the broker,
// which parseURL reads.
var urlParams = urlparam.Table[Option]{Scheme: "mem", Params: map[string]urlparam.Param[Option]{
	"broker":     urlparam.Text("", func(string) Option { return nil }),
	"visibility": urlparam.Duration("WithVisibilityTimeout", WithVisibilityTimeout),
}}

// parseURL reads mem://QUEUE?broker=NAME&visibility=DURATION; of a
// repeated parameter, the last value counts.
func parseURL(u *url.URL) (b *Broker, queue string, err error) {
	queue = strings.Trim(u.Host+u.Path, "/")
	if queue == "" {
		return nil, "", fmt.Errorf("mem URL has no queue name (use mem://payments)")
	}
	query, err := urlparam.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, "", fmt.Errorf("mem URL parameters: %w", err)
	}
	for k, vs := range query {
		query[k] = vs[len(vs)-1:]
	}
	opts, err := urlParams.Read(query)
	if err != nil {
		return nil, "", err
	}
	name := "default"
	if query.Has("broker") {
		name = query.Get("broker")
	}
	b, err = Named(name, opts...)
	return b, queue, urlParams.Explain(err)
}

func openSourceURL(_ context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
	b, queue, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return b.Subscribe(queue)
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
	b, queue, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return b.Publisher(queue), nil
}
