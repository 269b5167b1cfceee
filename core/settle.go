package core

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/idemq/idemq/internal/inflight"
)

// settleReport counts the results of one settling goroutine's settlements
// and logs their failures, once per set rather than once per message. A
// result that comes after its set (a retry that waited out its delay) is
// logged on its own.
type settleReport struct {
	log   *slog.Logger
	stats *counters

	mu         sync.Mutex
	collecting bool
	stale      []failure
	failed     []failure
}

type failure struct {
	id   string
	kind inflight.Kind
	err  error
}

func (r *settleReport) begin() {
	r.mu.Lock()
	r.collecting = true
	r.mu.Unlock()
}

// done is the inflight.Done of the goroutine's settlements.
func (r *settleReport) done(s inflight.Settlement, err error) {
	switch {
	case s.Kind == inflight.Release:
		if it, _ := s.H.Owner.(*item); it == nil || !it.heldBack { // counted as HeldBack
			r.stats.unsettled.Add(1)
		}
		return // the broker redelivers it whatever the call did
	case err == nil:
		if s.Kind == inflight.DeadLetter {
			r.stats.deadLettered.Add(1)
		}
		return
	}
	// Safe by design: an unsettled message is redelivered, and a committed
	// one then loses its claim and is acknowledged as a Duplicate.
	stale := errors.Is(err, ErrStaleDelivery)
	if stale {
		r.stats.stale.Add(1)
	} else {
		r.stats.settleErrors.Add(1)
	}
	f := failure{id: s.H.M.ID, kind: s.Kind, err: err}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.collecting {
		r.logLocked(f, stale)
		return
	}
	if stale {
		r.stale = append(r.stale, f)
	} else {
		r.failed = append(r.failed, f)
	}
}

// end logs what the set's settlements collected.
func (r *settleReport) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collecting = false
	r.summary(r.stale, true)
	r.summary(r.failed, false)
	clear(r.stale)
	clear(r.failed)
	r.stale, r.failed = r.stale[:0], r.failed[:0]
}

func (r *settleReport) summary(fs []failure, stale bool) {
	switch len(fs) {
	case 0:
	case 1:
		r.logLocked(fs[0], stale)
	default:
		msg := "idemq: settling failed; the broker will redeliver and the store will decide Duplicate"
		if stale {
			msg = "idemq: deliveries went stale before settling; the broker will redeliver"
		}
		level := slog.LevelWarn
		if stale {
			level = slog.LevelInfo
		}
		r.log.Log(nil, level, msg, "messages", len(fs), "first_id", shortID(fs[0].id), "settlement", kindName(fs[0].kind), "err", fs[0].err)
	}
}

func (r *settleReport) logLocked(f failure, stale bool) {
	if stale {
		r.log.Info("idemq: delivery went stale before settling; the broker will redeliver", "id", shortID(f.id), "settlement", kindName(f.kind), "err", f.err)
		return
	}
	r.log.Warn("idemq: settling failed; the broker will redeliver", "id", shortID(f.id), "settlement", kindName(f.kind), "err", f.err)
}

func kindName(k inflight.Kind) string {
	switch k {
	case inflight.Ack:
		return "ack"
	case inflight.Retry:
		return "retry"
	case inflight.DeadLetter:
		return "dead-letter"
	}
	return "give-back"
}
