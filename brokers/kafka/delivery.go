package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/core"
)

// Header names the adapter writes on the copies it produces to the
// dead-letter and retry topics.
const (
	// HeaderCause holds the dead-letter cause.
	HeaderCause = "idemq-cause"
	// HeaderOriginalTopic, HeaderOriginalPartition and HeaderOriginalOffset
	// hold where the dead-lettered (or retried) message was read from.
	HeaderOriginalTopic     = "idemq-original-topic"
	HeaderOriginalPartition = "idemq-original-partition"
	HeaderOriginalOffset    = "idemq-original-offset"
	// HeaderAttempt holds the attempt the message had when it was
	// dead-lettered, or the attempt of the next delivery of a retry copy.
	HeaderAttempt = "idemq-attempt"
	// HeaderNotBefore holds, on a retry copy, the time (Unix milliseconds)
	// before which it must not be processed.
	HeaderNotBefore = "idemq-not-before"
	// HeaderGroup holds the consumer group that dead-lettered the message.
	HeaderGroup = "idemq-group"
)

// dlqRetryDelay is how long a message waits before it is handed out again
// when producing its dead letter or retry copy failed.
const dlqRetryDelay = time.Second

// delivery is one handed-out message of a generation.
type delivery struct {
	src     *Source
	e       *entry
	gen     *generation
	msg     *core.Message
	settled atomic.Bool
}

// Message returns the received message.
func (d *delivery) Message() *core.Message { return d.msg }

func (d *delivery) wrap(err error) error {
	return fmt.Errorf("kafka: message %q (%s/%d@%d): %w", d.msg.ID, d.e.msg.Topic, d.e.msg.Partition, d.e.msg.Offset, err)
}

// Ack marks the message done. Its offset is committed with the next batched
// commit once every earlier message of the partition is decided too.
func (d *delivery) Ack(ctx context.Context) error {
	if d.settled.Swap(true) {
		return d.wrap(ErrAlreadySettled)
	}
	s := d.src
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.settleLocked(d, nil); err != nil {
		return d.wrap(err)
	}
	return nil
}

// Retry hands the message out again no sooner than delay, without letting
// the committed offset pass it: retried in place, later messages of its
// key (OrderPerKey) or partition (OrderPerPartition) wait behind it. With
// WithRetryTopic it produces a copy to the retry topic instead, waits for
// the write, and marks the original done.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if d.settled.Swap(true) {
		return d.wrap(ErrAlreadySettled)
	}
	s := d.src
	if s.cfg.retryTopic == "" {
		delay = max(delay, 0)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.settleLocked(d, &delay); err != nil {
			return d.wrap(err)
		}
		return nil
	}
	h := map[string]string{
		HeaderAttempt: strconv.Itoa(d.msg.Attempt + 1),
		// Rounded up: the copy must never be processed before its delay.
		HeaderNotBefore: strconv.FormatInt((time.Now().Add(delay).UnixNano()+999_999)/1_000_000, 10),
	}
	return d.produceThenDone(ctx, s.cfg.retryTopic, h)
}

// DeadLetter produces the message to the dead-letter topic with its cause,
// original topic, partition, offset and attempt in headers, waits until
// every in-sync replica has it (RequireAll), then marks the original done.
// If the write fails the message is not dropped: it is handed out again
// after a second and decided again.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if d.settled.Swap(true) {
		return d.wrap(ErrAlreadySettled)
	}
	text := "unknown"
	if cause != nil {
		text = cause.Error()
	}
	h := map[string]string{
		HeaderCause:   text,
		HeaderAttempt: strconv.Itoa(d.msg.Attempt),
		HeaderGroup:   d.src.cfg.group,
	}
	return d.produceThenDone(ctx, d.src.cfg.deadLetterTopic, h)
}

// produceThenDone writes a copy of the message with extra headers to
// topic, then marks the original done; on a failed write it retries the
// original in place.
func (d *delivery) produceThenDone(ctx context.Context, topic string, extra map[string]string) error {
	s := d.src
	s.mu.Lock()
	stale := d.gen.dead || s.closed
	if stale {
		// The next owner decides the message again; a copy now would be
		// a second one.
		_ = s.settleLocked(d, nil)
		s.mu.Unlock()
		return d.wrap(ErrStaleDelivery)
	}
	s.mu.Unlock()

	raw := d.e.msg
	headers := make([]kafkago.Header, 0, len(raw.Headers)+len(extra)+3)
	for _, h := range raw.Headers {
		if _, replaced := extra[h.Key]; replaced || isCoordinate(h.Key) {
			continue
		}
		headers = append(headers, h)
	}
	origTopic, origPart, origOff := raw.Topic, strconv.Itoa(raw.Partition), strconv.FormatInt(raw.Offset, 10)
	if d.e.p.retry {
		// A retry copy keeps pointing at where the message first was.
		for _, h := range raw.Headers {
			switch h.Key {
			case HeaderOriginalTopic:
				origTopic = string(h.Value)
			case HeaderOriginalPartition:
				origPart = string(h.Value)
			case HeaderOriginalOffset:
				origOff = string(h.Value)
			}
		}
	}
	extra[HeaderOriginalTopic] = origTopic
	extra[HeaderOriginalPartition] = origPart
	extra[HeaderOriginalOffset] = origOff
	for _, k := range sortedKeys(extra) {
		headers = append(headers, kafkago.Header{Key: k, Value: []byte(extra[k])})
	}
	err := s.dlqWriter().WriteMessages(ctx, kafkago.Message{
		Topic:   topic,
		Key:     raw.Key,
		Value:   raw.Value,
		Headers: headers,
		Time:    raw.Time,
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delay := dlqRetryDelay
		if serr := s.settleLocked(d, &delay); serr != nil {
			return d.wrap(fmt.Errorf("producing to %q: %w (and %w)", topic, err, serr))
		}
		s.cfg.logger.Warn("idemq kafka: producing a copy failed; the message is handed out again", "topic", topic, "message_id", d.msg.ID, "error", err)
		return d.wrap(fmt.Errorf("producing to %q: %w", topic, err))
	}
	if err := s.settleLocked(d, nil); err != nil {
		return d.wrap(fmt.Errorf("copy produced to %q, but: %w", topic, err))
	}
	return nil
}

func isCoordinate(k string) bool {
	switch k {
	case HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset, HeaderNotBefore:
		return true
	}
	return false
}

// retryHeaders reads a retry copy's not-before time and recorded attempt.
// The attempt returned is the number of deliveries before this copy.
func retryHeaders(hs []kafkago.Header) (time.Time, int) {
	var nb time.Time
	base := 0
	for _, h := range hs {
		switch h.Key {
		case HeaderNotBefore:
			if ms, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				nb = time.UnixMilli(ms)
			}
		case HeaderAttempt:
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n > 1 {
				base = n - 1
			}
		}
	}
	return nb, base
}

// toMessage converts a fetched message into the pipeline's Message.
func (s *Source) toMessage(e *entry, attempt int) *core.Message {
	m := &e.msg
	headers := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		headers[h.Key] = string(h.Value) // the last of repeated keys wins
	}
	key := string(m.Key)
	return &core.Message{
		ID:      headers[s.cfg.idHeader],
		Body:    m.Value,
		Headers: headers,
		Key:     key,
		Source:  s.cfg.topic,
		System:  "kafka",
		Attempt: attempt,
		Metadata: map[string]string{
			"messaging.destination.name":         e.p.topic,
			"messaging.destination.partition.id": e.p.idText,
			"messaging.kafka.offset":             strconv.FormatInt(m.Offset, 10),
			"messaging.kafka.message.key":        key,
			"messaging.consumer.group.name":      s.cfg.group,
		},
		ReceivedAt: time.Now(),
	}
}
