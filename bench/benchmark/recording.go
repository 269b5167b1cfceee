package benchmark

import (
	"context"
	"strconv"

	"github.com/idemq/idemq/core/driver"
)

// recordingSource records each message's decision when idemq settles it:
// right after the commit, as the baselines record theirs just before the
// ack. Recording there instead of in an observer keeps the bare idemq
// configurations free of any observer, as a service without tracing is.
type recordingSource struct {
	driver.Puller
	t *tracker
}

// recording wraps src so that its acks and dead letters are recorded,
// keeping the optional capabilities src has, and only those: the Consumer
// finds them by type assertion.
func recording(src driver.Source, t *tracker) driver.Source {
	r := &recordingSource{Puller: src.(driver.Puller), t: t}
	ext, e := src.(driver.Extender)
	rel, l := src.(driver.Releaser)
	ab, a := src.(driver.Abandoner)
	switch {
	case e && l && a:
		return struct {
			*recordingSource
			driver.Extender
			driver.Releaser
			driver.Abandoner
		}{r, ext, rel, ab}
	case e && l:
		return struct {
			*recordingSource
			driver.Extender
			driver.Releaser
		}{r, ext, rel}
	case e && a:
		return struct {
			*recordingSource
			driver.Extender
			driver.Abandoner
		}{r, ext, ab}
	case l && a:
		return struct {
			*recordingSource
			driver.Releaser
			driver.Abandoner
		}{r, rel, ab}
	case e:
		return struct {
			*recordingSource
			driver.Extender
		}{r, ext}
	case l:
		return struct {
			*recordingSource
			driver.Releaser
		}{r, rel}
	case a:
		return struct {
			*recordingSource
			driver.Abandoner
		}{r, ab}
	}
	return r
}

func (s *recordingSource) record(ms []*driver.Message) {
	for _, m := range ms {
		ts, _ := strconv.ParseInt(m.Headers[headerTS], 10, 64)
		s.t.decided(m.ID, ts)
	}
}

// Ack records the messages' decisions and acks them the adapter's way.
func (s *recordingSource) Ack(ctx context.Context, ms []*driver.Message) error {
	s.record(ms)
	return s.Puller.Ack(ctx, ms)
}

// DeadLetter records the messages' decisions (a retried message is decided
// again later) and parks them the adapter's way.
func (s *recordingSource) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	s.record(ms)
	return s.Puller.DeadLetter(ctx, ms, causes)
}
