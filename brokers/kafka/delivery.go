package kafka

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/internal/retry"

	kafkago "github.com/segmentio/kafka-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// Headers the adapter writes beside core/driver's bookkeeping ones.
const (
	// HeaderNotBefore holds, on a retry copy, the time (Unix milliseconds)
	// before which it must not be processed.
	HeaderNotBefore = "idemq-not-before"
	// HeaderGroup holds the consumer group that dead-lettered the message.
	HeaderGroup = "idemq-group"
)

// A copy is written up to copyAttempts times within a settlement; then the
// message is handed out again after dlqRetryDelay.
const (
	copyAttempts  = 4
	dlqRetryDelay = time.Second
)

// delivery is one handed-out message of a generation.
type delivery struct {
	src *Source
	e   *entry
	gen *generation
	msg *driver.Message // &m: one allocation for both
	m   driver.Message
	driver.SettleOnce
}

// Message returns the received message.
func (d *delivery) Message() *driver.Message { return d.msg }

// wrap names d's message in err; nil stays nil.
func (d *delivery) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("kafka: message %q (%s/%d@%d): %w", d.msg.ID, d.e.msg.Topic, d.e.msg.Partition, d.e.msg.Offset, err)
}

// settle claims d and marks its message done (requeue nil) or puts it
// back to wait *requeue.
func (d *delivery) settle(requeue *time.Duration) error {
	if err := d.Claim(); err != nil {
		return d.wrap(err)
	}
	d.src.mu.Lock()
	defer d.src.mu.Unlock()
	return d.wrap(d.src.settleLocked(d, requeue))
}

// Ack marks the message done; its offset is committed once every earlier
// message of the partition is decided too.
func (d *delivery) Ack(ctx context.Context) error { return d.settle(nil) }

// Retry hands the message out again no sooner than delay, and the
// committed offset waits for it (later messages of its key or partition
// wait behind it, as the ordering says). With WithRetryTopic it produces a
// copy to the retry topic instead, and marks the original done.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if d.src.cfg.retryTopic == "" {
		delay = max(delay, 0)
		return d.settle(&delay)
	}
	h := map[string]string{
		driver.AttemptHeader: strconv.Itoa(d.msg.Attempt + 1),
		// Rounded up: the copy must never be processed before its delay.
		HeaderNotBefore: strconv.FormatInt((time.Now().Add(delay).UnixNano()+999_999)/1_000_000, 10),
	}
	return d.produceThenDone(ctx, d.src.cfg.retryTopic, h, time.Time{})
}

// DeadLetter produces the message to the dead-letter topic with the
// bookkeeping headers (deadletter.Mark) and HeaderGroup, waits until every
// in-sync replica has it, then marks the original done. When the write
// keeps failing within the call, DeadLetter returns the error and the
// message is not dropped: it stays undecided and is handed out again after
// a second, as a retried message.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: d.msg.Attempt, Origin: d.origin(), At: time.Now()}
	mark.Destination, _, _ = strings.Cut(mark.Origin, "/")
	h := mark.Headers()
	h[HeaderGroup] = d.src.cfg.group
	return d.produceThenDone(ctx, d.src.cfg.deadLetterTopic, h, mark.At)
}

// produceThenDone writes a copy of the message with extra headers to
// topic, then marks the original done; when the write fails copyAttempts
// times, the original is retried in place. A delivery found stale sends
// nothing: the next owner decides the message again, a copy now would be a
// second one.
func (d *delivery) produceThenDone(ctx context.Context, topic string, extra map[string]string, at time.Time) error {
	if err := d.Claim(); err != nil {
		return d.wrap(err)
	}
	s := d.src
	msg := d.copyTo(topic, extra, at)
	var err error
	for try, pace := 1, retry.New(100*time.Millisecond, time.Second); try == 1 || pace.Wait(ctx); try++ {
		s.mu.Lock()
		if stale := s.staleness(d); stale != nil {
			_ = s.settleLocked(d, nil)
			s.mu.Unlock()
			return d.wrap(stale)
		}
		s.mu.Unlock()
		if err = s.dlqWriter().WriteMessages(ctx, msg); err == nil || try == copyAttempts || ctx.Err() != nil {
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if err := s.settleLocked(d, nil); err != nil {
			return d.wrap(fmt.Errorf("copy produced to %q, but: %w", topic, err))
		}
		return nil
	}
	delay := dlqRetryDelay
	if serr := s.settleLocked(d, &delay); serr != nil {
		return d.wrap(fmt.Errorf("producing to %q: %w (and %w)", topic, err, serr))
	}
	s.log().Warn("idemq kafka: producing a copy failed; the message stays undecided and is handed out again", "topic", topic, "message_id", d.msg.ID, "attempts", copyAttempts, "error", err)
	return d.wrap(fmt.Errorf("producing to %q: %w", topic, err))
}

// copyTo builds the copy of the message for topic, with extra headers and
// the origin, stamped at (zero: the producer's time, as a retry copy keeps;
// the dead-letter topic's retention counts from a dead letter's parking).
func (d *delivery) copyTo(topic string, extra map[string]string, at time.Time) kafkago.Message {
	raw := d.e.msg
	extra[driver.OriginHeader] = d.origin()
	headers := make([]kafkago.Header, 0, len(raw.Headers)+len(extra))
	for _, h := range raw.Headers {
		if _, replaced := extra[h.Key]; !replaced && h.Key != HeaderNotBefore {
			headers = append(headers, h)
		}
	}
	headers = appendHeaders(headers, extra)
	if at.IsZero() {
		at = raw.Time
	}
	return kafkago.Message{Topic: topic, Key: raw.Key, Value: raw.Value, Headers: headers, Time: at}
}

// origin is where the message was first consumed, as topic/partition/offset:
// a retry copy keeps pointing at the original.
func (d *delivery) origin() string {
	m := d.e.msg
	if i := slices.IndexFunc(m.Headers, func(h kafkago.Header) bool { return h.Key == driver.OriginHeader }); d.e.p.retry && i >= 0 {
		return string(m.Headers[i].Value)
	}
	return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
}

// retryHeaders reads a retry copy's not-before time and earlier deliveries.
func retryHeaders(hs []kafkago.Header) (notBefore time.Time, before int) {
	for _, h := range hs {
		n, err := strconv.ParseInt(string(h.Value), 10, 64)
		switch {
		case err != nil:
		case h.Key == HeaderNotBefore:
			notBefore = time.UnixMilli(n)
		case h.Key == driver.AttemptHeader && n > 1:
			before = int(n - 1)
		}
	}
	return notBefore, before
}

// toMessage converts a fetched message into the pipeline's Message.
func (s *Source) toMessage(e *entry, attempt int) *driver.Message {
	msg := new(driver.Message)
	s.fillMessage(msg, e, attempt)
	return msg
}

// fillMessage is toMessage into msg, which the caller allocates.
func (s *Source) fillMessage(msg *driver.Message, e *entry, attempt int) {
	m := &e.msg
	// The key and the header values are copied into one string and sliced
	// from it: one allocation for all of them, not one each.
	n := len(m.Key)
	for _, h := range m.Headers {
		n += len(h.Value)
	}
	var b strings.Builder
	b.Grow(n)
	b.Write(m.Key)
	for _, h := range m.Headers {
		b.Write(h.Value)
	}
	all := b.String()
	key, at := all[:len(m.Key)], len(m.Key)
	headers := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		headers[h.Key] = all[at : at+len(h.Value)] // the last of repeated keys wins
		at += len(h.Value)
	}
	*msg = driver.Message{ID: headers[s.cfg.idHeader], Body: m.Value, Headers: headers, Key: key, Source: s.cfg.topic, System: "kafka", Attempt: attempt,
		ReceivedAt: time.Now()}
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the topic the record came from, its partition, offset and
// key, and the consumer group.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		e := m.e
		_ = yield(string(semconv.MessagingDestinationNameKey), e.p.topic) &&
			yield(string(semconv.MessagingDestinationPartitionIDKey), e.p.idText) &&
			yield(string(semconv.MessagingKafkaOffsetKey), strconv.FormatInt(e.msg.Offset, 10)) &&
			yield(string(semconv.MessagingKafkaMessageKeyKey), m.m.Key) &&
			yield(string(semconv.MessagingConsumerGroupNameKey), m.src.cfg.group)
	}
}
