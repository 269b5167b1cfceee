package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemq/idemq/core/driver"
)

// maxBatchBytes is SQS's limit on the total payload of one
// SendMessageBatch call (bodies plus attribute names, types and values).
const maxBatchBytes = 256 * 1024

// Publisher sends messages to one queue with SendMessageBatch, ten at a
// time: the ID in the id attribute, Headers as String attributes (empty
// values left out: SQS refuses them) and the caller's trace context from
// the global OpenTelemetry propagator. On a FIFO queue the MessageGroupId
// is Message.Key and the MessageDeduplicationId comes from the business
// id, so SQS drops a resend within its five-minute window. A body that is
// not valid SQS text is sent base64 encoded, marked by idemq-encoding. It
// is safe for concurrent use.
type Publisher struct {
	cl     *awssqs.Client
	q      *queueInfo
	cfg    config
	others queues // other queues published to, by URL or name
	closed atomic.Bool
}

var _ driver.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher for the queue addr names, an sqs:// URL
// as core.OpenPublisher takes it; opts override its parameters.
func NewPublisher(ctx context.Context, addr string, opts ...PublisherOption) (*Publisher, error) {
	cfg, cl, q, err := setup(ctx, "NewPublisher", addr, false, opts)
	if err != nil {
		return nil, err
	}
	return &Publisher{cl: cl, q: q, cfg: cfg, others: queues{cl: cl}}, nil
}

// QueueURL returns the queue's URL.
func (p *Publisher) QueueURL() string { return p.q.url }

// Publish implements driver.Publisher: it sends msgs to queue (a URL or
// name; "" for the Publisher's own) and returns once SQS accepted every
// one, sending again the entries SQS fails on its side. A message SQS
// cannot take (an empty body, too many attributes, no valid group id on a
// FIFO queue, over MaximumMessageSize) fails the call before anything is
// sent; an entry SQS refuses as the sender's fault fails it at once, when
// others may have gone. Such errors, and a queue that does not exist, are
// marked driver.Permanent.
func (p *Publisher) Publish(ctx context.Context, queue string, msgs ...*driver.Message) error {
	if p.closed.Load() {
		return errors.New("sqs: publisher closed")
	}
	q := p.q
	var err error
	if queue != "" && queue != q.url && queue != q.name {
		if q, err = p.others.get(ctx, queue); err != nil {
			return permanentIfMissing(fmt.Errorf("sqs: publish: %w", err))
		}
	}
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	sizes := make([]int, len(msgs))
	for i, m := range msgs {
		if entries[i], sizes[i], err = p.entry(ctx, q, m); err != nil {
			return driver.Permanent(fmt.Errorf("sqs: publish message %d (%q): %w", i, m.ID, err))
		}
	}
	// Refused before anything is sent: SendMessageBatch would take the
	// others and refuse this one alone.
	if i, limit, err := p.oversized(ctx, q, sizes); err != nil {
		return fmt.Errorf("sqs: publish: %w", err)
	} else if i >= 0 {
		return driver.Permanent(fmt.Errorf("sqs: publish message %d (%q): %d bytes (body and attributes), over the MaximumMessageSize of %s (%d bytes)",
			i, msgs[i].ID, sizes[i], q.name, limit))
	}
	for start := 0; start < len(entries); {
		end, bytes := start, 0
		for end < len(entries) && end-start < 10 && (end == start || bytes+sizes[end] <= maxBatchBytes) {
			bytes += sizes[end]
			end++
		}
		if err := p.sendChunk(ctx, q, entries[start:end], msgs[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// entry builds one batch entry and its size as SQS counts it.
func (p *Publisher) entry(ctx context.Context, q *queueInfo, m *driver.Message) (types.SendMessageBatchRequestEntry, int, error) {
	h := maps.Clone(m.Headers)
	if h == nil {
		h = map[string]string{}
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(h))
	if m.ID != "" {
		h[p.cfg.idAttribute] = m.ID
	}
	var e types.SendMessageBatchRequestEntry
	if len(m.Body) == 0 {
		return e, 0, errors.New("empty body: SQS refuses it")
	}
	body := string(m.Body)
	if !validSQSText(body) {
		body = base64.StdEncoding.EncodeToString(m.Body)
		h[AttributeEncoding] = "base64"
	}
	size := len(body)
	attrs := make(map[string]types.MessageAttributeValue, len(h))
	for k, v := range h {
		if v == "" {
			continue
		}
		if err := checkAttributeName(k); err != nil {
			return e, 0, fmt.Errorf("header %q cannot be an SQS attribute: %w", k, err)
		}
		attrs[k] = stringAttr(v)
		size += len(k) + len("String") + len(v)
	}
	if len(attrs) > maxAttributes {
		return e, 0, fmt.Errorf("%d message attributes (id, headers and trace context); SQS allows %d", len(attrs), maxAttributes)
	}
	e = types.SendMessageBatchRequestEntry{MessageBody: aws.String(body), MessageAttributes: attrs}
	if q.fifo {
		if m.Key == "" {
			return e, 0, errors.New("FIFO queue needs a message group id: set Message.Key")
		}
		if err := checkGroupID(m.Key); err != nil {
			return e, 0, err
		}
		e.MessageGroupId = aws.String(m.Key)
		e.MessageDeduplicationId = aws.String(deduplicationID(m.ID, m.Body))
	}
	return e, size, nil
}

// checkGroupID refuses a message group id SQS would refuse, before any of
// the call is sent.
func checkGroupID(key string) error {
	if len(key) > 128 {
		return fmt.Errorf("message group id (Message.Key) is %d bytes; SQS takes at most 128", len(key))
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < '!' || c > '~' {
			return fmt.Errorf("message group id (Message.Key) has byte %d = %q; SQS takes letters, digits and ASCII punctuation", i, c)
		}
	}
	return nil
}

// sendChunk sends up to ten entries, sending again those SQS fails on its
// side.
func (p *Publisher) sendChunk(ctx context.Context, q *queueInfo, entries []types.SendMessageBatchRequestEntry, msgs []*driver.Message) error {
	idx := make([]int, len(entries))
	for i := range entries {
		entries[i].Id, idx[i] = aws.String(strconv.Itoa(i)), i
	}
	var fatal, last error
	left, _ := resending(ctx, idx, p.cfg.settleRetries, func(idx []int) (again []int) {
		pending := make([]types.SendMessageBatchRequestEntry, len(idx))
		for j, i := range idx {
			pending[j] = entries[i]
		}
		out, err := p.cl.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: pending})
		if err != nil {
			fatal = permanentIfMissing(fmt.Errorf("sqs: SendMessageBatch to %s: %w", q.name, err))
			return nil
		}
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < 0 || i >= len(entries) {
				fatal = fmt.Errorf("sqs: SendMessageBatch to %s: unknown entry id %q in the reply", q.name, aws.ToString(f.Id))
				return nil
			}
			last = fmt.Errorf("sqs: send %q to %s: %s: %s", msgs[i].ID, q.name, aws.ToString(f.Code), aws.ToString(f.Message))
			if f.SenderFault { // it would fail every time
				fatal = driver.Permanent(last)
				return nil
			}
			again = append(again, i)
		}
		return again
	})
	switch {
	case fatal != nil || len(left) == 0:
		return fatal
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", last, ctx.Err())
	}
	return fmt.Errorf("%w (%d entries still failing after %d retries)", last, len(left), p.cfg.settleRetries)
}

// oversized returns the index of the first of sizes over q's
// MaximumMessageSize, and that limit, or -1 when none is. Before it finds
// one over, it reads the attribute again: the limit may have been raised.
func (p *Publisher) oversized(ctx context.Context, q *queueInfo, sizes []int) (int, int64, error) {
	over := func(limit int64) int {
		return slices.IndexFunc(sizes, func(s int) bool { return limit > 0 && int64(s) > limit })
	}
	if over(q.maxSize.Load()) < 0 {
		return -1, 0, nil
	}
	out, err := p.cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameMaximumMessageSize}})
	if err != nil {
		return -1, 0, permanentIfMissing(fmt.Errorf("queue %q: reading MaximumMessageSize: %w", q.name, err))
	}
	limit := maxMessageSize(out.Attributes)
	q.maxSize.Store(limit)
	return over(limit), limit, nil
}

// permanentIfMissing marks err driver.Permanent when it is SQS's answer
// that the queue does not exist.
func permanentIfMissing(err error) error {
	var nq *types.QueueDoesNotExist
	if errors.As(err, &nq) {
		return driver.Permanent(err)
	}
	return err
}

// Close implements driver.Publisher: Publish fails afterwards. The SQS
// client holds no connection that needs closing.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}

// deduplicationID derives a FIFO MessageDeduplicationId from the business
// id: the id itself when SQS takes it as one, else its SHA-256 in hex. A
// message without an id falls back to the body's hash, as content-based
// deduplication would.
func deduplicationID(id string, body []byte) string {
	if id != "" && checkGroupID(id) == nil {
		return id
	}
	if id != "" {
		body = []byte(id)
	}
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// validSQSText reports whether SQS accepts s as a message body: valid
// Unicode of #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF.
func validSQSText(s string) bool {
	if s == "" || !utf8.ValidString(s) { // valid UTF-8 holds no surrogates
		return false
	}
	for _, r := range s {
		if r < 0x20 && r != 0x9 && r != 0xA && r != 0xD || r == 0xFFFE || r == 0xFFFF {
			return false
		}
	}
	return true
}
