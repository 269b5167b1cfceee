package sqs

import (
	"context"
	"time"
)

// heartbeat extends the visibility of every unsettled delivery once per
// interval, before it can lapse, in ChangeMessageVisibilityBatch calls of
// ten. Each extension asks for a full visibility timeout from now, but
// never past WithMaxExtension after the receipt: a message still unsettled
// then lapses and SQS may hand it to another consumer, where the dedup key
// keeps its effect to one commit. Settled deliveries leave the live set and
// are no longer extended.
func (s *Source) heartbeat() {
	defer s.wg.Done()
	t := time.NewTicker(s.hbEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.extendDue(time.Now())
	}
}

// extendDue extends the deliveries whose visibility would lapse within two
// heartbeat intervals (so a slow round trip or a late tick cannot let one
// lapse).
func (s *Source) extendDue(now time.Time) {
	type ext struct {
		d    *delivery
		secs int32
	}
	var due []ext
	s.mu.Lock()
	for d := range s.live {
		if d.state != stateLive || d.hbFailed {
			continue
		}
		if d.deadline.Sub(now) > s.vis-s.hbEvery/2 {
			continue // extended (or received) less than half an interval ago
		}
		limit := d.receivedAt.Add(s.cfg.maxExtension)
		want := min(s.vis, limit.Sub(now))
		secs := int32(want / time.Second)
		if secs < 1 || !now.Add(time.Duration(secs)*time.Second).After(d.deadline) {
			continue // at the cap: let it lapse
		}
		due = append(due, ext{d, secs})
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.vis)
	defer cancel()
	secsOf := make(map[*delivery]int32, len(due))
	ds := make([]*delivery, len(due))
	for i, e := range due {
		ds[i], secsOf[e.d] = e.d, e.secs
	}
	for start := 0; start < len(ds); start += 10 {
		chunk := ds[start:min(start+10, len(ds))]
		sent := time.Now()
		failed, err := s.changeVisibilityChunk(ctx, chunk, func(d *delivery) int32 { return secsOf[d] })
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.stats.heartbeatFailures.Add(int64(len(chunk)))
			s.log().Warn("idemq sqs: visibility heartbeat failed; trying again next beat", "queue", s.q.name, "messages", len(chunk), "error", err)
			continue
		}
		s.mu.Lock()
		for i, d := range chunk {
			if e, bad := failed[i]; bad {
				if d.state != stateLive {
					continue // settled meanwhile: its handle may be gone, as it should
				}
				s.stats.heartbeatFailures.Add(1)
				d.hbFailures++
				if e.permanent || d.hbFailures >= 3 {
					d.hbFailed = true
				}
				if e.gone {
					d.gone = e.err // settling it now would be refused too
				}
				s.log().Warn("idemq sqs: visibility extension refused", "queue", s.q.name, "message_id", d.msg.ID, "error", e.err, "gave_up", d.hbFailed)
				continue
			}
			d.hbFailures = 0
			// Measured from before the call: the deadline SQS set is no
			// earlier than this.
			d.deadline = sent.Add(time.Duration(secsOf[d]) * time.Second)
			s.stats.extended.Add(1)
		}
		s.mu.Unlock()
	}
}
