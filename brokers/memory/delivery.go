package memory

import (
	"container/heap"
	"iter"
	"log/slog"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// delivery is one lease of a message to a subscription, until the
// visibility timeout: its message's AckID.
type delivery struct {
	sub *Subscription
	e   *entry
	seq uint64
	msg driver.Message

	// guarded by the queue's mutex
	lease hnode // the lease deadline
}

func (d *delivery) node() *hnode { return &d.lease }

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the delivery and publish sequences and the subscriber.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		_ = yield(MetaDeliverySeq, slog.Uint64Value(m.seq)) &&
			yield(MetaPublishSeq, slog.Uint64Value(m.e.seq)) &&
			yield(MetaSubscriber, slog.Uint64Value(m.sub.id))
	}
}

func (q *queue) ackLocked(d *delivery) {
	q.endLeaseLocked(d)
	d.e.state = stateDone
	q.stats.Acked++
	q.checkIdleLocked()
}

func (q *queue) retryLocked(d *delivery, delay time.Duration) {
	q.endLeaseLocked(d)
	q.stats.Retried++
	e := d.e
	if delay <= 0 {
		q.makeReadyLocked(e)
	} else {
		e.state = stateDelayed
		e.delay.at = time.Now().Add(delay)
		heap.Push(&q.delayed, e)
		q.armLocked()
	}
}
