package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/hostlist"
	"github.com/idemq/idemq/core/driver/retry"
)

// DeadLetters is an operator's handle on the dead-letter queue of one
// consumer's queue (driver.DeadLetters and driver.Redriver, what admin.OpenDeadLetters
// returns for an amqp:// or amqps:// URL). Redrive publishes to
// Parked.Destination through the default exchange, mandatory and
// confirmed, without the bookkeeping headers and the broker's x-death,
// x-first-death-* and x-delivery-count, so the consumer sees a first
// attempt; it acks the parked copy only after the confirm.
//
// AMQP cannot read a message without taking it: each call takes the
// messages ready when it begins with basic.get on a channel of its own,
// acks those it removes, and closing the channel at the end returns the
// others in their places (a quorum queue counts the return in
// x-delivery-count, harmless without a delivery limit on the dead-letter
// queue). So the broker holds every message a call took until it ends, and
// two calls that run at once each see only what the other does not hold.
// Parked.Ref is a digest of the copy's properties, headers and body ("~2",
// "~3", … for identical copies), as AMQP gives a message no lasting id.
// A DeadLetters is not safe for concurrent use.
type DeadLetters struct {
	*deadletter.Queue[*amqp.Delivery]
}

// dlqStore is the dead-letter queue as deadletter.Queue reads and changes
// it: Republish and Remove act on the copy Each holds.
type dlqStore struct {
	link
	cfg  config
	ch   confirmCh // the current call's
	kept int       // copies the current call took and did not ack
}

// OpenDeadLetters connects to the broker at addr, the Source's URL and
// options, and returns the dead-letter queue of its queue: the one
// WithDeadLetterQueue names, else "<queue>.dlq". Options about the
// connection, the dead-letter queue and the id header apply; the others
// are checked and ignored. It declares nothing: the dead-letter queue must
// exist, as a Source declares it.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	cfg, ns, err := openConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	q := &dlqStore{link: link{dialer: hostlist.NewDialer(ns, cfg.open)}, cfg: cfg}
	if err := q.connect(ctx); err != nil {
		return nil, err
	}
	if _, err := q.ready(); err != nil {
		q.Close()
		return nil, err
	}
	return &DeadLetters{deadletter.New[*amqp.Delivery](q)}, nil
}

// ready returns how many messages the dead-letter queue holds ready, read
// on a channel of its own (a failed check closes its channel).
func (q *dlqStore) ready() (int, error) {
	ch, err := q.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: dead-letter queue %q: %w", q.Name(), err)
	}
	return st.Messages, nil
}

// Name implements deadletter.Store.
func (q *dlqStore) Name() string { return q.cfg.deadLetterQueue }

// Republish implements deadletter.Store: d's properties, typed headers and
// body, without the bookkeeping of its delivery, dead-lettering and
// retries, confirmed.
func (q *dlqStore) Republish(ctx context.Context, d *amqp.Delivery, p *driver.Parked) error {
	pub := republishing(d)
	for k := range pub.Headers {
		if slices.Contains(deadletter.Bookkeeping, k) || k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-idemq-") {
			delete(pub.Headers, k)
		}
	}
	return q.ch.publish(ctx, "", p.Destination, true, pub)
}

// Remove implements deadletter.Store: it acks d on the call's channel.
func (q *dlqStore) Remove(_ context.Context, d *amqp.Delivery) error {
	if err := q.ch.Ack(d.DeliveryTag, false); err != nil {
		return err
	}
	q.kept--
	return nil
}

// Each implements deadletter.Store: it takes, one at a time, as many
// messages as the queue held ready when it began (fewer if it runs out),
// and calls fn with each while it holds it. The messages not removed go
// back to the queue when the channel closes at the end.
func (q *dlqStore) Each(ctx context.Context, fn func(*amqp.Delivery, *driver.Parked) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := q.connect(ctx); err != nil {
		return err
	}
	if err := q.ch.open(q.conn); err != nil { // the last call's is closed
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	q.kept = 0
	defer func() {
		// Closing the channel returns the unacked messages; it also waits
		// for the broker to have processed the acks sent before it.
		if cerr := q.ch.Close(); err == nil && cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = fmt.Errorf("rabbitmq: closing the channel of %q: %w", q.Name(), cerr)
		}
		q.awaitReturned(ctx)
	}()
	n, err := q.ready()
	if err != nil {
		return err
	}
	refs := make(deadletter.Refs, n)
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := q.ch.Get(q.Name(), false)
		if err != nil {
			return fmt.Errorf("rabbitmq: get from %q: %w", q.Name(), err)
		}
		if !ok {
			return nil // another client took the rest
		}
		q.kept++
		if err := fn(&d, q.parked(&d, refs)); err != nil {
			return err
		}
	}
	return nil
}

// awaitReturned waits, at most 5s and while ctx lasts, until the queue
// holds the messages the call left parked ready again. A quorum queue
// takes back the messages of a closed channel after the close completes:
// without the wait, a call that follows at once would count too few
// messages and miss some.
func (q *dlqStore) awaitReturned(ctx context.Context) {
	if q.kept == 0 || q.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		n, err := q.ready()
		if err != nil || n >= q.kept || !retry.Sleep(ctx, 10*time.Millisecond) {
			return
		}
	}
}

// parked reads d as an operator sees it; refs are the call's, to tell
// identical copies apart.
func (q *dlqStore) parked(d *amqp.Delivery, refs deadletter.Refs) *driver.Parked {
	id, _ := messageID(q.cfg.idHeader, d)
	key, _ := d.Headers[KeyHeader].(string)
	p := &driver.Parked{ID: id, Key: key, Headers: renderHeaders(d.Headers), Body: d.Body, Ref: contentRef(d, refs)}
	if death, ok := lastDeath(d.Headers); ok && d.Headers[driver.CauseHeader] == nil {
		// The broker dead-lettered it (DeadLetterReject, a delivery limit,
		// a TTL): it records neither the cause nor the attempt.
		p.Cause = deathCause(death)
		p.Origin, _ = death["queue"].(string)
		p.ParkedAt, _ = death["time"].(time.Time) // whole seconds, rounded down
		p.Attempt = -1                            // not a retry copy's AttemptHeader either
	}
	deadletter.Read(p)
	p.Attempt = max(p.Attempt, 0)
	if p.ParkedAt.IsZero() {
		p.ParkedAt = d.Timestamp // the send time, if the producer set it
	}
	p.Destination = cmp.Or(p.Destination, p.Origin, q.cfg.queue)
	return p
}

// lastDeath returns the newest entry of the x-death header, which the
// broker keeps newest first.
func lastDeath(h amqp.Table) (amqp.Table, bool) {
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return nil, false
	}
	t, ok := deaths[0].(amqp.Table)
	return t, ok
}

// deathReasons explains the reasons RabbitMQ records in x-death.
var deathReasons = map[string]string{
	"rejected":       "rejected by the consumer (its log has the cause)",
	"expired":        "expired (message TTL)",
	"maxlen":         "dropped by the queue's length limit",
	"delivery_limit": "delivered more times than the queue's delivery limit",
}

// deathCause is the Cause of a message the broker dead-lettered, from its
// newest x-death entry.
func deathCause(death amqp.Table) string {
	reason, _ := death["reason"].(string)
	queue, _ := death["queue"].(string)
	text := "dead-lettered by the broker"
	if r, ok := deathReasons[reason]; ok {
		text = r
	}
	text = fmt.Sprintf("rabbitmq: %s: x-death reason %q from queue %q", text, reason, queue)
	if n, ok := toInt(death["count"]); ok && n > 1 {
		text += fmt.Sprintf(", %d times", n)
	}
	return text
}

// contentRef identifies a parked copy by what it holds, so the same copy
// gets the same Ref in every call while it stays parked (see
// deadletter.Refs): its properties, headers (but x-delivery-count, which a
// quorum queue raises each time a call returns it) and body.
func contentRef(d *amqp.Delivery, refs deadletter.Refs) string {
	fields := []string{d.MessageId, d.CorrelationId, d.Type, strconv.FormatInt(d.Timestamp.UnixNano(), 10)}
	rendered := renderHeaders(d.Headers)
	delete(rendered, "x-delivery-count")
	delete(rendered, "x-death") // holds times in the local zone; its newest time is below
	if death, ok := lastDeath(d.Headers); ok {
		if t, ok := death["time"].(time.Time); ok {
			fields = append(fields, strconv.FormatInt(t.Unix(), 10))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(rendered)) {
		fields = append(fields, k, rendered[k])
	}
	return refs.Of(append(fields, string(d.Body))...)
}
