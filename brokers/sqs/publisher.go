package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/idemq/idemq/internal/retry"

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

// Publisher sends core Messages to one queue with SendMessageBatch, ten at
// a time. Each message's ID goes into the message-id attribute (or the one
// WithIDAttribute names), its Headers into String attributes (empty values
// are left out: SQS refuses them), and the caller's trace context is
// injected with the global OpenTelemetry propagator. On a FIFO queue the
// MessageGroupId is Message.Key and the MessageDeduplicationId is derived
// from the business id, so a resend within SQS's five-minute window is
// dropped by SQS itself. A body that is not valid SQS text is sent base64
// encoded and marked with the idemq-encoding attribute; the Source decodes
// it. It is safe for concurrent use.
type Publisher struct {
	cl      *awssqs.Client
	q       *queueInfo
	cfg     config
	mu      sync.Mutex
	closed  bool
	retries int
	others  map[string]*queueInfo // other queues published to, by URL or name
}

var _ driver.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher for the queue given by URL or name. Of
// the options, the client options, WithIDAttribute and WithSettleRetries
// (how many more times failed entries are sent again; default 3) apply.
func NewPublisher(ctx context.Context, queueURLOrName string, opts ...Option) (*Publisher, error) {
	cfg, cl, q, err := setup(ctx, "NewPublisher", queueURLOrName, opts)
	if err != nil {
		return nil, err
	}
	return &Publisher{cl: cl, q: q, cfg: cfg, retries: cfg.settleRetries}, nil
}

// queue resolves a Publish destination, remembering the queues it looked
// up.
func (p *Publisher) queue(ctx context.Context, dest string) (*queueInfo, error) {
	if dest == "" || dest == p.q.url || dest == p.q.name {
		return p.q, nil
	}
	p.mu.Lock()
	q, ok := p.others[dest]
	p.mu.Unlock()
	if ok {
		return q, nil
	}
	q, err := resolveQueue(ctx, p.cl, dest)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.others == nil {
		p.others = map[string]*queueInfo{}
	}
	p.others[dest] = q
	p.mu.Unlock()
	return q, nil
}

// QueueURL returns the queue's URL.
func (p *Publisher) QueueURL() string { return p.q.url }

// Client returns the SQS client.
func (p *Publisher) Client() *awssqs.Client { return p.cl }

// Publish sends msgs to queue (a queue URL or name; "" for the queue the
// Publisher was made for) and returns once SQS accepted every one. Entries SQS
// fails for a reason of its own are sent again; an entry it refuses as
// invalid (a sender fault) fails the call at once, naming the message.
// When Publish fails some messages may have been sent: retry the call and
// let the consumer's dedup drop the copies. A message over the queue's
// MaximumMessageSize (body and attributes, as SQS counts them; the
// attribute is read again before a message is refused) fails the call
// before any message is sent. Its error is marked driver.Permanent when no
// retry can succeed: a message over that size, an entry refused as the
// sender's fault, a message SQS cannot take (an empty body, too many
// attributes, no key for a FIFO queue or one that is no valid group id), or
// a queue that does not exist.
func (p *Publisher) Publish(ctx context.Context, queue string, msgs ...*driver.Message) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return errors.New("sqs: publisher closed")
	}
	q, err := p.queue(ctx, queue)
	if err != nil {
		return permanentIf(missingQueue(err), fmt.Errorf("sqs: publish: %w", err))
	}
	entries := make([]types.SendMessageBatchRequestEntry, 0, len(msgs))
	sizes := make([]int, 0, len(msgs))
	for i, m := range msgs {
		e, size, err := p.entry(ctx, q, m)
		if err != nil {
			// SQS would refuse the message every time.
			return driver.Permanent(fmt.Errorf("sqs: publish message %d (%q): %w", i, m.ID, err))
		}
		entries = append(entries, e)
		sizes = append(sizes, size)
	}
	if i, limit, err := p.oversized(ctx, q, sizes); err != nil {
		return fmt.Errorf("sqs: publish: %w", err)
	} else if i >= 0 {
		// Refused before anything is sent: SendMessageBatch would take
		// the others and refuse this one alone.
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
	h := make(map[string]string, len(m.Headers)+4)
	for k, v := range m.Headers {
		h[k] = v
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(h))
	if m.ID != "" {
		h[p.cfg.idAttribute] = m.ID
	}
	if len(m.Body) == 0 {
		return types.SendMessageBatchRequestEntry{}, 0, errors.New("empty body: SQS refuses it")
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
			return types.SendMessageBatchRequestEntry{}, 0, fmt.Errorf("header %q cannot be an SQS attribute: %w", k, err)
		}
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		size += len(k) + len("String") + len(v)
	}
	if len(attrs) > maxAttributes {
		return types.SendMessageBatchRequestEntry{}, 0, fmt.Errorf("%d message attributes (id, headers and trace context); SQS allows %d", len(attrs), maxAttributes)
	}
	e := types.SendMessageBatchRequestEntry{MessageBody: aws.String(body), MessageAttributes: attrs}
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

// checkGroupID refuses a message group id SQS would refuse as the
// sender's fault, before anything of the call is sent: SendMessageBatch
// would take the call's other entries and refuse this one alone.
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

// sendChunk sends up to ten entries, retrying the ones SQS fails on its
// side.
func (p *Publisher) sendChunk(ctx context.Context, q *queueInfo, entries []types.SendMessageBatchRequestEntry, msgs []*driver.Message) error {
	pending := make([]int, len(entries))
	for i := range pending {
		pending[i] = i
	}
	pause := retry.New(settlePause, settlePause<<maxSettleRetries)
	for try := 0; ; try++ {
		batch := make([]types.SendMessageBatchRequestEntry, len(pending))
		for k, i := range pending {
			batch[k] = entries[i]
			batch[k].Id = aws.String(strconv.Itoa(i))
		}
		out, err := p.cl.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: batch})
		if err != nil {
			return permanentIf(missingQueue(err), fmt.Errorf("sqs: SendMessageBatch to %s: %w", q.name, err))
		}
		var again []int
		var last error
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < 0 || i >= len(entries) {
				return fmt.Errorf("sqs: SendMessageBatch to %s: unknown entry id %q in the reply", q.name, aws.ToString(f.Id))
			}
			fe := fmt.Errorf("sqs: send %q to %s: %s: %s", msgs[i].ID, q.name, aws.ToString(f.Code), aws.ToString(f.Message))
			if f.SenderFault {
				// SQS refuses the entry itself (too large for the queue,
				// characters it does not take): it would every time.
				return driver.Permanent(fe)
			}
			again = append(again, i)
			last = fe
		}
		if len(again) == 0 {
			return nil
		}
		if try >= p.retries {
			return fmt.Errorf("%w (%d entries still failing after %d retries)", last, len(again), try)
		}
		if !pause.Wait(ctx) {
			return fmt.Errorf("%w: %w", last, ctx.Err())
		}
		pending = again
	}
}

// oversized returns the index of the first of sizes over q's
// MaximumMessageSize, and that limit, or -1 when none is. Before it finds
// one over, it reads the attribute again: the limit may have been raised
// since it was read.
func (p *Publisher) oversized(ctx context.Context, q *queueInfo, sizes []int) (int, int64, error) {
	over := func(limit int64) int {
		if limit <= 0 {
			return -1
		}
		for i, s := range sizes {
			if int64(s) > limit {
				return i
			}
		}
		return -1
	}
	if over(q.maxSize.Load()) < 0 {
		return -1, 0, nil
	}
	out, err := p.cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(q.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameMaximumMessageSize},
	})
	if err != nil {
		return -1, 0, permanentIf(missingQueue(err), fmt.Errorf("queue %q: reading MaximumMessageSize: %w", q.name, err))
	}
	limit := maxMessageSize(out.Attributes)
	q.maxSize.Store(limit)
	return over(limit), limit, nil
}

// missingQueue reports whether err is SQS's answer that the queue does
// not exist.
func missingQueue(err error) bool {
	var nq *types.QueueDoesNotExist
	return errors.As(err, &nq)
}

// permanentIf returns err, marked driver.Permanent when permanent is set.
func permanentIf(permanent bool, err error) error {
	if permanent {
		return driver.Permanent(err)
	}
	return err
}

// Close marks the publisher closed; Publish fails afterwards. The SQS
// client holds no connection that needs closing.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// deduplicationID derives a FIFO MessageDeduplicationId from the business
// id: the id itself when it is at most 128 characters of the allowed set,
// else its SHA-256 in hex. A message without an id falls back to the
// body's hash, as content-based deduplication would.
func deduplicationID(id string, body []byte) string {
	if id == "" {
		sum := sha256.Sum256(body)
		return hex.EncodeToString(sum[:])
	}
	if len(id) <= 128 {
		ok := true
		for i := 0; i < len(id); i++ {
			if c := id[i]; c < '!' || c > '~' { // printable ASCII only
				ok = false
				break
			}
		}
		if ok {
			return id
		}
	}
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// validSQSText reports whether SQS accepts s as a message body: valid
// Unicode of #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF.
func validSQSText(s string) bool {
	if s == "" {
		return false // SQS refuses an empty body
	}
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF:
		case r >= 0xE000 && r <= 0xFFFD:
		case r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}
