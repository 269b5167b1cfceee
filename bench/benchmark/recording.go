package benchmark

import (
	"context"
	"strconv"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// recordingSource records each message's decision when idemq settles it:
// right after the commit, as the baselines record theirs just before the
// ack. Recording there instead of in an observer keeps the bare idemq
// configurations free of any observer, as a service without tracing is.
type recordingSource struct {
	driver.Source
	t *tracker
}

func (s *recordingSource) Receive(ctx context.Context) (driver.Delivery, error) {
	d, err := s.Source.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return recordingDelivery{d, s.t}, nil
}

// SetWindow passes the Consumer's window on to the adapter.
func (s *recordingSource) SetWindow(n int) error {
	if ws, ok := s.Source.(driver.WindowSetter); ok {
		return ws.SetWindow(n)
	}
	return nil
}

// RedeliveryHorizon passes the adapter's horizon on.
func (s *recordingSource) RedeliveryHorizon(ctx context.Context) (time.Duration, bool) {
	if h, ok := s.Source.(driver.RedeliveryHorizoner); ok {
		return h.RedeliveryHorizon(ctx)
	}
	return 0, false
}

// AckBatch records the batch's decisions and acks it the adapter's way.
func (s *recordingSource) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	inner := make([]driver.Delivery, len(ds))
	for i, d := range ds {
		rd := d.(recordingDelivery)
		rd.record()
		inner[i] = rd.Delivery
	}
	if bs, ok := s.Source.(driver.BatchSettler); ok {
		return bs.AckBatch(ctx, inner)
	}
	var first error
	for _, d := range inner {
		if err := d.Ack(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// recordingDelivery records its message's decision when it is acked or
// dead-lettered (a retried delivery is decided again later).
type recordingDelivery struct {
	driver.Delivery
	t *tracker
}

func (d recordingDelivery) record() {
	m := d.Message()
	ts, _ := strconv.ParseInt(m.Headers[headerTS], 10, 64)
	d.t.decided(m.ID, ts)
}

func (d recordingDelivery) Ack(ctx context.Context) error {
	d.record()
	return d.Delivery.Ack(ctx)
}

func (d recordingDelivery) DeadLetter(ctx context.Context, cause error) error {
	d.record()
	return d.Delivery.DeadLetter(ctx, cause)
}
