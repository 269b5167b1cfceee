package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/hostlist"
	"github.com/idemq/idemq/core/driver/option"
)

// KeyHeader carries Message.Key (an ordering key, which AMQP has no
// property for) from this package's Publisher to its Source.
const KeyHeader = "idemq-key"

// PublisherOption configures a Publisher. An invalid value makes
// NewPublisher fail with an error naming the option.
type PublisherOption func(*pubConfig) error

type pubConfig struct {
	connConfig
	exchange   string
	routingKey string
	mandatory  bool
}

// WithPublishExchange sets the exchange messages are published to.
// Default "" (the default exchange, where the routing key is a queue name).
func WithPublishExchange(name string) PublisherOption {
	return set("WithPublishExchange", short("name", name), func(c *pubConfig) { c.exchange = name })
}

// WithRoutingKey sets the routing key Publish uses when its destination
// is "": on the default exchange, the queue's name. Default "".
func WithRoutingKey(key string) PublisherOption {
	return set("WithRoutingKey", short("key", key), func(c *pubConfig) { c.routingKey = key })
}

// WithMandatory sets the mandatory flag: a message no queue receives is
// returned and Publish fails instead of the broker dropping it. Default
// true.
func WithMandatory(mandatory bool) PublisherOption {
	return set("WithMandatory", nil, func(c *pubConfig) { c.mandatory = mandatory })
}

// WithPublisherConnectionName sets the connection_name client property.
// Default "idemq-publisher".
func WithPublisherConnectionName(name string) PublisherOption {
	return connName[pubConfig]("WithPublisherConnectionName", name)
}

// WithPublisherIDHeader makes Publish write each message's id in the named
// header as well as in the message_id property, for consumers that read it
// from a header (see WithIDHeader). Default "": message_id only.
func WithPublisherIDHeader(name string) PublisherOption {
	return idHeader[pubConfig]("WithPublisherIDHeader", name)
}

// WithPublisherDialConfig sets the amqp091-go connection config. Default:
// amqp091-go's defaults. Its Recovery field must be nil.
func WithPublisherDialConfig(cfg amqp.Config) PublisherOption {
	return dialConfig[pubConfig]("WithPublisherDialConfig", cfg)
}

// Publisher publishes core Messages with publisher confirms: Publish returns
// only once the broker has taken responsibility for every message. It sets
// message_id from Message.ID (and, with WithPublisherIDHeader, that
// header), the headers from Message.Headers, Message.Key in KeyHeader and
// persistent delivery mode. After a connection loss the next Publish
// reconnects. It is safe for concurrent use; calls are serialized.
type Publisher struct {
	cfg pubConfig

	mu     sync.Mutex
	link   // the next connect tries the node after the one reached last
	closed bool
	ch     confirmCh
}

// link is a connection dialled when needed, through a URL's nodes: the
// Publisher's and DeadLetters'.
type link struct {
	*dialer
	conn *amqp.Connection
}

// connect dials, unless the connection is open.
func (l *link) connect(ctx context.Context) error {
	if l.conn != nil && !l.conn.IsClosed() {
		return nil
	}
	conn, err := l.Dial(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: connect: %w", err)
	}
	l.conn = conn
	return nil
}

// Close closes the connection, if open.
func (l *link) Close() error {
	if l.conn == nil {
		return nil
	}
	err := l.conn.Close()
	if l.conn = nil; errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// NewPublisher connects to the broker at addr, a URL as Open takes it
// (its nodes dialled as Open dials them), and opens a confirm channel. Of
// the URL's parameters, queue sets the routing key (WithRoutingKey),
// exchange the exchange (WithPublishExchange) and id_header the id header
// (WithPublisherIDHeader), so one URL serves both sides; the other
// consumer parameters are checked and ignored, and opts apply after them.
func NewPublisher(ctx context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	amqpURL, queue, srcOpts, err := readURL(addr)
	if err != nil {
		return nil, err
	}
	src, ns := defaultConfig(""), hostlist.List{}
	if queue != "" {
		src, ns, err = sourceConfig(amqpURL, queue, srcOpts)
	} else if err = option.Apply(&src, srcOpts...); err == nil {
		ns, err = parseNodes(amqpURL)
	}
	if err != nil {
		return nil, err
	}
	cfg := pubConfig{
		connConfig: connConfig{connName: "idemq-publisher", idHeader: src.idHeader},
		exchange:   src.exchange,
		routingKey: queue,
		mandatory:  true,
	}
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, link: link{dialer: hostlist.NewDialer(ns, cfg.open)}}
	if err := p.connect(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// connect opens the connection and the confirm channel, each unless it is
// open. p.mu is held.
func (p *Publisher) connect(ctx context.Context) error {
	if err := p.link.connect(ctx); err != nil {
		return err
	}
	if err := p.ch.open(p.conn); err != nil {
		p.link.Close()
		return fmt.Errorf("rabbitmq: publisher channel: %w", err)
	}
	return nil
}

// Publish publishes msgs with routing key key (a queue name on the default
// exchange; "" for the WithRoutingKey default) and waits for the broker's
// confirms. It fails if any message is nacked or, with mandatory on,
// unroutable; some messages may then have been published, so callers
// retry the whole call and rely on the consumer's dedup. A message
// returned with 312 NO_ROUTE (no queue is bound for the key) fails the
// call with an error marked driver.Permanent: it fails the same way until
// a queue is declared or bound.
func (p *Publisher) Publish(ctx context.Context, key string, msgs ...*driver.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("rabbitmq: publisher closed")
	}
	if err := p.connect(ctx); err != nil {
		return err
	}
	// The caller's trace context travels in the headers, so the
	// consumer's process span can link to the producer's.
	var traceHeaders propagation.MapCarrier
	if trace.SpanContextFromContext(ctx).IsValid() {
		traceHeaders = propagation.MapCarrier{}
		otel.GetTextMapPropagator().Inject(ctx, traceHeaders)
	}
	now := time.Now()
	ps := make([]amqp.Publishing, len(msgs))
	for i, m := range msgs {
		h := make(amqp.Table, len(m.Headers)+len(traceHeaders))
		for k, v := range m.Headers {
			h[k] = v
		}
		for k, v := range traceHeaders {
			h[k] = v
		}
		if m.Key != "" {
			h[KeyHeader] = m.Key
		}
		if p.cfg.idHeader != "" && m.ID != "" {
			h[p.cfg.idHeader] = m.ID
		}
		ps[i] = amqp.Publishing{MessageId: m.ID, Headers: h, Body: m.Body, DeliveryMode: amqp.Persistent, Timestamp: now}
	}
	if err := p.ch.publish(ctx, p.cfg.exchange, cmp.Or(key, p.cfg.routingKey), p.cfg.mandatory, ps...); err != nil {
		return fmt.Errorf("rabbitmq: %w", err)
	}
	return nil
}

// Close closes the connection. Publish fails afterwards.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return p.link.Close()
}

// confirmChunk bounds the messages awaiting confirms at once, and so the
// basic.returns that can pile up before publish reads them (amqp091-go
// drops a notification a listener does not take).
const confirmChunk = 256

// confirmCh is a channel in confirm mode and the channel its basic.returns
// arrive on: the Publisher's, a session's for its republishes, and a
// dead-letter call's for its redrives.
type confirmCh struct {
	*amqp.Channel
	returns chan amqp.Return
}

// open opens c on conn, unless it is open, with its returns waiting in
// confirmChunk places.
func (c *confirmCh) open(conn *amqp.Connection) error {
	if c.Channel != nil && !c.IsClosed() {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return err
	}
	*c = confirmCh{ch, ch.NotifyReturn(make(chan amqp.Return, confirmChunk))}
	return nil
}

// publish publishes ps to exchange with routing key key, nothing else
// awaiting a confirm on c, and waits for their confirms, confirmChunk
// messages at a time. A returned message fails the call, marked
// driver.Permanent for 312 NO_ROUTE (no queue is bound for the key: it
// fails the same way until one is), and so does a nack; the messages
// before it may have been published. A call cut short closes c: a late
// confirm or return of ps could be taken for the next call's, which must
// start on a fresh channel.
func (c confirmCh) publish(ctx context.Context, exchange, key string, mandatory bool, ps ...amqp.Publishing) error {
	for chunk := range slices.Chunk(ps, confirmChunk) {
		confs := make([]*amqp.DeferredConfirmation, 0, len(chunk))
		for _, p := range chunk {
			conf, err := c.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, p)
			if err != nil {
				c.Close()
				return fmt.Errorf("publish %q: %w", p.MessageId, err)
			}
			confs = append(confs, conf)
		}
		nacked := 0
		for _, conf := range confs {
			acked, err := conf.WaitContext(ctx)
			if err != nil {
				c.Close()
				return fmt.Errorf("waiting for publisher confirms: %w", err)
			}
			if !acked {
				nacked++
			}
		}
		// The broker sends basic.return before the confirm, and amqp091-go
		// hands both over from one reader goroutine, so every return of
		// chunk is buffered by now.
		if n := len(c.returns); n > 0 {
			first := <-c.returns
			for range n - 1 {
				<-c.returns
			}
			err := fmt.Errorf("%d of %d messages unroutable with key %q: %d %s", n, len(chunk), key, first.ReplyCode, first.ReplyText)
			if first.ReplyCode == amqp.NoRoute {
				return driver.Permanent(err)
			}
			return err
		}
		if nacked > 0 {
			return fmt.Errorf("%d of %d messages not confirmed by the broker", nacked, len(chunk))
		}
	}
	return nil
}
