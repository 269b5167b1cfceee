package kafka

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// Headers the adapter writes beside core/driver's bookkeeping ones.
const (
	// HeaderNotBefore holds, on a retry copy, the time (Unix milliseconds)
	// before which it must not be processed.
	HeaderNotBefore = "idemq-not-before"
	// HeaderGroup holds the consumer or share group that dead-lettered the
	// message.
	HeaderGroup = "idemq-group"
)

// dlqRetryDelay is how long a message whose copy could not be produced
// waits before it is handed out again.
const dlqRetryDelay = time.Second

// message is the Message of e's latest hand-out: the entry's own the first
// time (read when fetched), a new one after a retry, since the Consumer may
// still read the one it settled.
func (s *Source) message(e *entry, now time.Time) *driver.Message {
	m := &e.first
	if e.handouts > 1 {
		m = new(driver.Message)
		readRecord(e.r, &s.cfg, m)
	}
	m.Source, m.Attempt, m.ReceivedAt, m.AckID, m.Metadata = s.cfg.topic, e.attempt, now, e, (*metadata)(e)
	return m
}

// readRecord fills m from r: its id from the id header (the last of
// repeated ones), else with WithOffsetID its topic/partition/offset.
func readRecord(r *kgo.Record, c *config, m *driver.Message) {
	// The key and the header values are copied into one string and sliced
	// from it: one allocation for all of them, not one each.
	n := len(r.Key)
	for _, h := range r.Headers {
		n += len(h.Value)
	}
	var b strings.Builder
	b.Grow(n)
	b.Write(r.Key)
	for _, h := range r.Headers {
		b.Write(h.Value)
	}
	all := b.String()
	key, at := all[:len(r.Key)], len(r.Key)
	headers := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		headers[h.Key] = all[at : at+len(h.Value)] // the last of repeated keys wins
		at += len(h.Value)
	}
	*m = driver.Message{Body: r.Value, Headers: headers, Key: key, Source: r.Topic, System: "kafka"}
	id, found := headers[c.idHeader]
	switch {
	case id != "":
		m.ID = id
	case c.offsetID:
		m.ID = recordOrigin(r)
	case found:
		m.IDError = fmt.Errorf("the %s header is empty", c.idHeader)
	}
}

// recordOrigin names r as topic/partition/offset.
func recordOrigin(r *kgo.Record) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// origin is where e's message was first consumed: a retry copy keeps
// pointing at the original.
func (e *entry) origin() string {
	if e.p.retry {
		for _, h := range e.r.Headers {
			if h.Key == driver.OriginHeader {
				return string(h.Value)
			}
		}
	}
	return recordOrigin(e.r)
}

// metadata is a handed-out message's Metadata, read from its entry when
// asked.
type metadata entry

// All yields the topic the record came from, its partition, offset and
// key, and the consumer group.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		e := (*entry)(m)
		_ = yield(string(semconv.MessagingDestinationNameKey), slog.StringValue(e.p.topic)) &&
			yield(string(semconv.MessagingDestinationPartitionIDKey), slog.StringValue(e.p.idText)) &&
			yield(string(semconv.MessagingKafkaOffsetKey), slog.Int64Value(e.r.Offset)) &&
			yield(string(semconv.MessagingKafkaMessageKeyKey), slog.StringValue(string(e.r.Key))) &&
			yield(string(semconv.MessagingConsumerGroupNameKey), slog.StringValue(e.p.src.cfg.group))
	}
}

// retryHeaders reads a retry copy's not-before time and earlier deliveries.
func retryHeaders(hs []kgo.RecordHeader) (notBefore time.Time, before int) {
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

// deadLetterHeaders are the headers a dead letter's copy gets, and when it
// was parked.
func deadLetterHeaders(cause error, attempt int, origin, group string) (map[string]string, time.Time) {
	mark := deadletter.Mark{Cause: deadletter.Cause(cause), Attempt: attempt, Origin: origin, At: time.Now()}
	mark.Destination, _, _ = strings.Cut(origin, "/")
	h := mark.Headers()
	h[HeaderGroup] = group
	return h, mark.At
}

// copyRecord is r's copy for topic, with extra headers over its own (a
// retry copy's not-before time dropped) and stamped at (zero: r's time, as
// a retry copy keeps; a dead-letter topic's retention counts from the
// parking).
func copyRecord(r *kgo.Record, topic string, extra map[string]string, at time.Time) *kgo.Record {
	cp := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: at, Headers: make([]kgo.RecordHeader, 0, len(r.Headers)+len(extra))}
	if at.IsZero() {
		cp.Timestamp = r.Timestamp
	}
	for _, h := range r.Headers {
		if _, replaced := extra[h.Key]; !replaced && h.Key != HeaderNotBefore {
			cp.Headers = append(cp.Headers, h)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		cp.Headers = append(cp.Headers, kgo.RecordHeader{Key: k, Value: []byte(extra[k])})
	}
	return cp
}

// copyThenDone produces a copy of each message of ms to topic, with the
// headers extra gives (and its time), acknowledged by every in-sync
// replica, then marks the original done. A message found stale sends
// nothing: its partition's next owner decides it again, and a copy now
// would be a second one. A message whose copy failed stays undecided and
// is handed out again after dlqRetryDelay; its error is reported.
func (s *Source) copyThenDone(ctx context.Context, ms []*driver.Message, topic string, extra func(i int, e *entry) (map[string]string, time.Time)) error {
	errs := make([]error, len(ms))
	es := make([]*entry, len(ms))
	s.mu.Lock()
	for i, m := range ms {
		if es[i], errs[i] = s.entryOf(m); errs[i] == nil {
			errs[i] = s.staleLocked(es[i])
		}
	}
	s.mu.Unlock()
	var recs []*kgo.Record
	var idx []int
	for i, e := range es {
		if errs[i] == nil {
			h, at := extra(i, e)
			recs, idx = append(recs, copyRecord(e.r, topic, h, at)), append(idx, i)
		}
	}
	res := s.cl.ProduceSync(ctx, recs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.broadcast()
	var failed error
	for k, i := range idx {
		e := es[i]
		if err := res[k].Err; err != nil {
			failed = s.cfg.explain(err)
			errs[i] = e.wrap(fmt.Errorf("producing to %q: %w", topic, failed))
			if serr := s.settleLocked(e, true, time.Now().Add(dlqRetryDelay)); serr != nil {
				errs[i] = fmt.Errorf("%w (and %w)", errs[i], serr)
			}
		} else if err := s.settleLocked(e, false, time.Time{}); err != nil {
			errs[i] = fmt.Errorf("copy produced to %q, but: %w", topic, err)
		}
	}
	if failed != nil {
		s.log().Warn("idemq kafka: producing a copy failed; the message stays undecided and is handed out again", "topic", topic, "error", failed)
	}
	return driver.PartialOf(errs)
}
