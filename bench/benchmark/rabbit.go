package benchmark

import (
	"context"
	"fmt"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/brokers/rabbitmq"
)

// rabbit is the RabbitMQ side of a run: its connection URL for raw
// amqp091-go, and the user's idemq URL to reopen with another queue.
type rabbit struct {
	idemqURL *url.URL // Config.Broker
	rawURL   string   // without idemq's parameters, for amqp091-go
	base     string
}

// amqpParams are the URI parameters amqp091-go itself reads; everything
// else in Config.Broker is idemq's and is kept away from amqp.Dial.
var amqpParams = map[string]bool{
	"heartbeat": true, "connection_timeout": true, "channel_max": true, "auth_mechanism": true,
	"certfile": true, "keyfile": true, "cacertfile": true, "server_name_indication": true,
}

func newRabbit(broker string) (*rabbit, error) {
	u, err := url.Parse(broker)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Broker: not a URL")
	}
	q := u.Query()
	base := q.Get("queue")
	if base == "" {
		base = "idemq-bench"
	}
	raw := *u
	keep := url.Values{}
	for k, v := range q {
		if amqpParams[k] {
			keep[k] = v
		}
	}
	raw.RawQuery = keep.Encode()
	return &rabbit{idemqURL: u, rawURL: raw.String(), base: base}, nil
}

func (r *rabbit) kind() string           { return "RabbitMQ" }
func (r *rabbit) baseQueue() string      { return r.base }
func (r *rabbit) describe(string) string { return "" }
func (r *rabbit) close()                 {}
func (r *rabbit) ping(context.Context) error {
	conn, err := amqp.Dial(r.rawURL)
	if err != nil {
		return err
	}
	return conn.Close()
}

// sourceURL is Config.Broker with its queue replaced by queue.
func (r *rabbit) sourceURL(queue, _ string) string {
	u := *r.idemqURL
	q := u.Query()
	q.Set("queue", queue)
	u.RawQuery = q.Encode()
	return u.String()
}

// version returns the server's product and version.
func (r *rabbit) version(context.Context) string {
	conn, err := amqp.Dial(r.rawURL)
	if err != nil {
		return "RabbitMQ (version unknown)"
	}
	defer conn.Close()
	return fmt.Sprintf("%v %v", conn.Properties["product"], conn.Properties["version"])
}

// declare creates queue with the topology idemq's adapter declares for the
// user's URL (so every configuration, idemq or not, reads the same kind of
// queue), by opening the adapter once.
func (r *rabbit) declare(ctx context.Context, queue string) error {
	s, err := rabbitmq.Open(ctx, r.sourceURL(queue, ""))
	if err != nil {
		return err
	}
	return s.Close()
}

// remove deletes queue and the queues idemq's topology adds to it.
func (r *rabbit) remove(queue string) error {
	conn, err := amqp.Dial(r.rawURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	var first error
	for _, q := range []string{queue, queue + ".dlq", queue + ".retry"} {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil && first == nil {
			first = err
		}
		ch.Close()
	}
	return first
}

// publisher publishes with confirms, many in flight, on one channel.
type publisher struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	queue   string
	pending []*amqp.DeferredConfirmation
}

func (r *rabbit) publisher(queue string) (*publisher, error) {
	conn, err := amqp.Dial(r.rawURL)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &publisher{conn: conn, ch: ch, queue: queue}, nil
}

// publish sends one message; confirms are collected by wait, and at most
// 2,000 are left outstanding.
func (p *publisher) publish(ctx context.Context, id string, body []byte) error {
	c, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, false, false, amqp.Publishing{
		MessageId:    id,
		Body:         body,
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{headerTS: time.Now().UnixNano()},
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", id, err)
	}
	p.pending = append(p.pending, c)
	if len(p.pending) >= 2000 {
		return p.wait(ctx, 1000)
	}
	return nil
}

// wait waits until at most keep confirms are outstanding.
func (p *publisher) wait(ctx context.Context, keep int) error {
	n := len(p.pending) - keep
	for i := 0; i < n; i++ {
		ok, err := p.pending[i].WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("publisher confirm: %w", err)
		}
		if !ok {
			return fmt.Errorf("publisher: broker nacked a message")
		}
	}
	if n > 0 {
		p.pending = append(p.pending[:0], p.pending[n:]...)
	}
	return nil
}

func (p *publisher) close(ctx context.Context) error {
	err := p.wait(ctx, 0)
	p.conn.Close()
	return err
}

// publishBacklog publishes the workload's backlog and waits for every
// confirm.
func (r *rabbit) publishBacklog(ctx context.Context, queue string, w *workload) error {
	p, err := r.publisher(queue)
	if err != nil {
		return err
	}
	for _, num := range w.seq {
		if err := p.publish(ctx, backlogID(int(num)), w.body(int(num))); err != nil {
			p.conn.Close()
			return err
		}
	}
	return p.close(ctx)
}

// publishPaced publishes paced messages at rate per second until count
// were sent or, once minCount were, stop closes (nil: no stop), and
// returns how many it sent.
func (r *rabbit) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	p, err := r.publisher(queue)
	if err != nil {
		return 0, err
	}
	sent, err := pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		return p.publish(ctx, id, w.body(num))
	})
	if err != nil {
		p.conn.Close()
		return sent, err
	}
	return sent, p.close(ctx)
}

// pace calls send for paced message after paced message at rate per
// second, open loop, until count were sent or, once minCount were, stop
// closes (nil: no stop), and returns how many it sent. Message k has the
// id pacedID(k) and the workload number w.n + k.
func pace(ctx context.Context, w *workload, rate, count, minCount int, stop <-chan struct{}, send func(id string, num int) error) (int, error) {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	sent := 0
	stopped := false
	for sent < count {
		// Stop early when asked, but not before minCount messages give
		// the percentiles something to stand on.
		select {
		case <-stop:
			stopped, stop = true, nil
		default:
		}
		if stopped && sent >= minCount {
			break
		}
		// Open loop: the schedule does not wait for the consumer, so a
		// slow consumer shows in the latency instead of hiding in it.
		due := start.Add(time.Duration(sent) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-stop:
				stopped, stop = true, nil
				continue
			case <-ctx.Done():
				return sent, ctx.Err()
			}
		}
		if err := send(pacedID(sent), w.n+sent); err != nil {
			return sent, err
		}
		sent++
	}
	return sent, nil
}
