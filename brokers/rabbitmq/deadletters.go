package rabbitmq

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/retry"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
)

// DeadLetters is an operator's handle on the dead-letter queue of one
// consumer's queue: it lists the parked messages (Scan), publishes chosen
// ones back to the queue they came from (Redrive) and deletes chosen ones
// (Purge). It implements admin.DeadLetterQueue and is what
// admin.OpenDeadLetters returns for an amqp:// or amqps:// URL.
//
// AMQP cannot read a message without taking it, so each call takes the
// messages ready in the dead-letter queue when it begins, one by one with
// basic.get and manual acknowledgement on a channel of its own, acks the
// ones it removes, and leaves the others unacknowledged: closing the
// channel at the end of the call returns them to the queue in their
// places (a classic queue keeps their order; a quorum queue delivers
// returned messages first and counts the return in x-delivery-count, which
// harms nothing because the dead-letter queue the Source declares has no
// delivery limit; a policy that gives it one would drop messages that are
// scanned often). So while a call runs, every parked message it took so
// far is held unacknowledged on its channel, which the broker keeps in
// memory until the call ends: a scan of a large dead-letter queue holds
// all of it there at its end (the client holds one message at a time,
// and what fn keeps). Messages parked after a call began are left to the
// next call.
//
// AMQP gives a queued message no lasting id, so Parked.Ref is a digest of
// the parked copy's properties, headers and body (with "~2", "~3", … for
// identical copies): the same in every call while the copy stays parked,
// so a Ref listed by Scan selects that copy in a later Redrive or Purge.
//
// A DeadLetters is not safe for concurrent use, and two calls, from this
// process or another, that run at once each see only the messages the
// other one does not hold.
type DeadLetters struct {
	nodes nodes
	next  int // the node the next dial tries first
	cfg   config
	queue string // the consumer's queue: the Destination of messages with no recorded origin
	conn  *amqp.Connection
}

var _ admin.DeadLetterQueue = (*DeadLetters)(nil)

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
	q := &DeadLetters{nodes: ns, next: rand.IntN(len(ns.urls)), cfg: cfg, queue: cfg.queue}
	if err := q.connect(ctx); err != nil {
		return nil, err
	}
	ch, err := q.conn.Channel()
	if err != nil {
		q.Close()
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(cfg.deadLetterQueue, true, false, false, false, nil); err != nil {
		q.Close()
		return nil, fmt.Errorf("rabbitmq: dead-letter queue %q: %w", cfg.deadLetterQueue, err)
	}
	return q, nil
}

// Name returns the dead-letter queue's name.
func (q *DeadLetters) Name() string { return q.cfg.deadLetterQueue }

// Scan calls fn with each message parked when it began, in queue order,
// and leaves them all parked. An error from fn stops the scan and is
// returned. See DeadLetters for what the broker holds while it runs.
func (q *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	return q.browse(ctx, func(*browser, *amqp.Delivery, *admin.Parked) (bool, error) { return false, nil }, fn)
}

// Redrive publishes each message parked when it began that sel chooses to
// the queue it came from (Parked.Destination) through the default
// exchange, mandatory and confirmed, with its properties, headers and body
// but without idemq's bookkeeping headers (driver.CauseHeader and the
// others DeadLetter writes) and the broker's (x-delivery-count, x-death,
// x-first-death-*), so the consumer sees a first attempt; only after the
// confirm does it ack, and so remove, the parked copy. progress, if not
// nil, is called after each message redriven. It returns the number
// redriven; after an error (an unroutable destination among them) the rest
// are still parked.
func (q *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	done := 0
	err := q.browse(ctx, func(b *browser, d *amqp.Delivery, p *admin.Parked) (bool, error) {
		if !sel(p) {
			return false, nil
		}
		if err := b.publish(ctx, p.Destination, redriven(d)); err != nil {
			return false, fmt.Errorf("rabbitmq: redrive %q (ref %s) to %q: %w", p.ID, p.Ref, p.Destination, err)
		}
		if err := b.ch.Ack(d.DeliveryTag, false); err != nil {
			return false, fmt.Errorf("rabbitmq: redrive %q (ref %s): published, but removing it from %q failed: %w", p.ID, p.Ref, q.Name(), err)
		}
		done++
		if progress != nil {
			progress(done)
		}
		return true, nil
	}, nil)
	return done, err
}

// Purge deletes (acks) each message parked when it began that sel chooses
// and returns how many.
func (q *DeadLetters) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	done := 0
	err := q.browse(ctx, func(b *browser, d *amqp.Delivery, p *admin.Parked) (bool, error) {
		if !sel(p) {
			return false, nil
		}
		if err := b.ch.Ack(d.DeliveryTag, false); err != nil {
			return false, fmt.Errorf("rabbitmq: purge %q (ref %s): %w", p.ID, p.Ref, err)
		}
		done++
		return true, nil
	}, nil)
	return done, err
}

// Close closes the connection.
func (q *DeadLetters) Close() error {
	if q.conn == nil {
		return nil
	}
	err := q.conn.Close()
	q.conn = nil
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

// connect (re)connects, when there is no open connection, to one of the
// nodes, from the one after the last reached.
func (q *DeadLetters) connect(ctx context.Context) error {
	if q.conn != nil && !q.conn.IsClosed() {
		return nil
	}
	conn, next, err := dialNodes(ctx, q.nodes, q.next, q.cfg.connConfig)
	q.next = next
	if err != nil {
		return fmt.Errorf("rabbitmq: connect: %w", err)
	}
	q.conn = conn
	return nil
}

// browser is the channel one call takes parked messages on, in confirm
// mode for the publishes of Redrive.
type browser struct {
	ch      *amqp.Channel
	returns chan amqp.Return
}

// publish publishes p to queue and waits for its confirm.
func (b *browser) publish(ctx context.Context, queue string, p amqp.Publishing) error {
	_, err := publishConfirmed(ctx, b.ch, b.returns, queue, p)
	return err
}

// actFunc is what a call does with one message d it took, read as p; it
// says whether it acked (removed) d.
type actFunc func(b *browser, d *amqp.Delivery, p *admin.Parked) (acked bool, err error)

// browse takes, one at a time, as many messages as the dead-letter queue
// held ready when it began (fewer if it runs out), and calls act with each
// (and then list, if not nil); an error from either ends the call. The
// messages act does not ack go back to the queue when the channel closes
// at the end.
func (q *DeadLetters) browse(ctx context.Context, act actFunc, list func(*admin.Parked) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := q.connect(ctx); err != nil {
		return err
	}
	ch, returns, err := confirmChannel(q.conn)
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	b := &browser{ch: ch, returns: returns}
	kept, err := q.take(ctx, b, act, list)
	// Closing the channel returns the unacked messages; it also waits for
	// the broker to have processed the acks sent before it.
	if cerr := ch.Close(); err == nil && cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
		err = fmt.Errorf("rabbitmq: closing the channel of %q: %w", q.Name(), cerr)
	}
	q.awaitReturned(ctx, kept)
	return err
}

// returnWait bounds how long a call waits for the messages it leaves
// parked to be ready again.
const returnWait = 5 * time.Second

// awaitReturned waits, at most returnWait and while ctx lasts, until the
// dead-letter queue holds at least kept ready messages again. A quorum
// queue takes back the messages of a closed channel after the close
// completes: without the wait, a call that follows at once would count too
// few messages and miss some. Other clients taking messages meanwhile can
// only make it wait the whole bound.
func (q *DeadLetters) awaitReturned(ctx context.Context, kept int) {
	if kept == 0 || q.conn == nil {
		return
	}
	ch, err := q.conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	ctx, cancel := context.WithTimeout(ctx, returnWait)
	defer cancel()
	for {
		st, err := ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil)
		if err != nil || st.Messages >= kept || !retry.Sleep(ctx, 10*time.Millisecond) {
			return
		}
	}
}

// take is browse's loop on b. kept counts the messages it took and did
// not ack.
func (q *DeadLetters) take(ctx context.Context, b *browser, act actFunc, list func(*admin.Parked) error) (kept int, err error) {
	st, err := b.ch.QueueDeclarePassive(q.Name(), true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: dead-letter queue %q: %w", q.Name(), err)
	}
	seen := make(map[string]int, st.Messages)
	for range st.Messages {
		if err := ctx.Err(); err != nil {
			return kept, err
		}
		d, ok, err := b.ch.Get(q.Name(), false)
		if err != nil {
			return kept, fmt.Errorf("rabbitmq: get from %q: %w", q.Name(), err)
		}
		if !ok {
			return kept, nil // another client took the rest
		}
		kept++
		p := q.parked(&d, seen)
		acked, err := act(b, &d, p)
		if acked {
			kept--
		}
		if err != nil {
			return kept, err
		}
		if list != nil {
			if err := list(p); err != nil {
				return kept, err
			}
		}
	}
	return kept, nil
}

// parked reads d as an operator sees it. seen counts the refs given so
// far in this call, to tell identical copies apart.
func (q *DeadLetters) parked(d *amqp.Delivery, seen map[string]int) *admin.Parked {
	id, _ := messageID(q.cfg.idHeader, d)
	key, _ := d.Headers[KeyHeader].(string)
	p := &admin.Parked{
		ID:      id,
		Key:     key,
		Headers: renderHeaders(d.Headers),
		Body:    d.Body,
	}
	death, _ := lastDeath(d.Headers)
	if cause, ok := d.Headers[driver.CauseHeader].(string); ok {
		// The Source republished it (DeadLetterRepublish).
		p.Cause = cause
		p.Origin, _ = d.Headers[driver.OriginHeader].(string)
		p.Attempt, _ = toInt(d.Headers[driver.AttemptHeader])
	} else if death != nil {
		// The broker dead-lettered it (DeadLetterReject, a delivery limit,
		// a TTL): it records neither the cause nor the attempt.
		p.Cause = deathCause(death)
		p.Origin, _ = death["queue"].(string)
	}
	stamp, _ := d.Headers[driver.ParkedAtHeader].(string)
	parkedAt, err := time.Parse(time.RFC3339Nano, stamp)
	deathTime, died := death["time"].(time.Time) // whole seconds, rounded down
	switch {
	case err == nil:
		p.ParkedAt = parkedAt
	case died && d.Headers[driver.CauseHeader] == nil:
		p.ParkedAt = deathTime
	default:
		p.ParkedAt = d.Timestamp // the send time, if the producer set it
	}
	p.Destination, _ = d.Headers[driver.DestinationHeader].(string)
	p.Destination = cmp.Or(p.Destination, p.Origin, q.queue)
	p.Ref = contentRef(d, seen)
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
// gets the same Ref in every call while it stays parked: a digest of its
// properties, headers (but x-delivery-count, which a quorum queue raises
// each time a call returns it) and body, with "~2", "~3", … for identical
// copies after the first in the queue.
func contentRef(d *amqp.Delivery, seen map[string]int) string {
	h := sha256.New()
	field := func(s string) {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	field(d.MessageId)
	field(d.CorrelationId)
	field(d.Type)
	field(strconv.FormatInt(d.Timestamp.UnixNano(), 10))
	rendered := renderHeaders(d.Headers)
	delete(rendered, "x-delivery-count")
	delete(rendered, "x-death") // holds times in the local zone; its newest time is below
	if death, ok := lastDeath(d.Headers); ok {
		if t, ok := death["time"].(time.Time); ok {
			field(strconv.FormatInt(t.Unix(), 10))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(rendered)) {
		field(k)
		field(rendered[k])
	}
	field(string(d.Body))
	ref := hex.EncodeToString(h.Sum(nil)[:8])
	seen[ref]++
	if n := seen[ref]; n > 1 {
		ref += "~" + strconv.Itoa(n)
	}
	return ref
}

// bookkeeping are the headers DeadLetter writes on a parked copy.
var bookkeeping = []string{driver.CauseHeader, driver.AttemptHeader, driver.OriginHeader, driver.ParkedAtHeader, driver.DestinationHeader}

// redriven is the publishing Redrive sends for d: d's properties, headers
// and body without the bookkeeping of its delivery, dead-lettering and
// retries.
func redriven(d *amqp.Delivery) amqp.Publishing {
	p := republishing(d)
	for k := range p.Headers {
		if slices.Contains(bookkeeping, k) || k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-idemq-") {
			delete(p.Headers, k)
		}
	}
	return p
}
