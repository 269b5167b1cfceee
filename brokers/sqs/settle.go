package sqs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// ErrClosed is wrapped, with driver.ErrStaleDelivery, by the error of a
// settlement or extension after Close: nothing is sent, and SQS hands the
// message out again once its visibility lapses.
var ErrClosed = errors.New("sqs: source closed")

// own returns the deliveries of ms and the call's errors, set (and the
// delivery nil) for a message not this Source's, or all after Close.
func (s *Source) own(ms []*driver.Message) ([]*delivery, []error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	ds, errs := make([]*delivery, len(ms)), make([]error, len(ms))
	for i, m := range ms {
		d, ok := m.AckID.(*delivery)
		switch {
		case !ok || d.src != s:
			errs[i] = fmt.Errorf("sqs: message %q is not from this source", m.ID)
		case closed:
			errs[i] = d.wrap(driver.Stale(ErrClosed))
		default:
			ds[i] = d
		}
	}
	return ds, errs
}

// note sets errs[i] for each ds[i] that failed a step what (got[i]), and
// returns ds without those.
func note(ds []*delivery, errs, got []error, what string) []*delivery {
	left := slices.Clone(ds)
	for i, err := range got {
		if err != nil {
			errs[i], left[i] = ds[i].wrap(fmt.Errorf("%s: %w", what, err)), nil
		}
	}
	return left
}

// Ack implements driver.Source: DeleteMessageBatch, ten per request.
// Entries SQS fails are sent again (WithSettleRetries); one whose receipt
// handle SQS refuses is stale.
func (s *Source) Ack(ctx context.Context, ms []*driver.Message) error {
	ds, errs := s.own(ms)
	note(ds, errs, s.deleteAll(ctx, ds), "delete")
	s.settled(ctx, ds, errs, true)
	return driver.PartialOf(errs)
}

// Retry implements driver.Source: each message's visibility becomes
// delay, in whole seconds up to what is left of SQS's twelve hours since
// the receipt. On a FIFO queue the messages held back behind it are made
// visible again.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	ds, errs := s.own(ms)
	secs := int32((max(delay, 0) + time.Second - 1) / time.Second)
	got := s.setVisibility(ctx, ds, func(i int) int32 { return ds[i].capped(secs) })
	note(ds, errs, got, fmt.Sprintf("retry (visibility %ds; it comes back when its visibility timeout lapses)", secs))
	s.settled(ctx, ds, errs, false)
	return driver.PartialOf(errs)
}

// Release implements driver.Releaser: the messages, and on a FIFO queue
// those held back behind them, become visible again at once, unless
// WithReleaseOnClose(false) leaves them to their visibility timeout.
func (s *Source) Release(ctx context.Context, ms []*driver.Message) error {
	if !s.cfg.releaseOnClose {
		return nil
	}
	ds, errs := s.own(ms)
	note(ds, errs, s.release(ctx, ds), "release")
	s.settled(ctx, ds, errs, false)
	return driver.PartialOf(errs)
}

// Extend implements driver.Extender: ChangeMessageVisibilityBatch renews
// each message's visibility by the visibility timeout, never past
// WithMaxExtension after it was handed out (up to a second past, SQS
// counting whole seconds); on a FIFO queue the messages held back behind
// it are renewed with it. One whose receipt handle SQS refuses is stale.
// It fails with WithHeartbeat(false).
func (s *Source) Extend(ctx context.Context, ms []*driver.Message) error {
	if !s.cfg.heartbeat {
		return errors.New("sqs: Extend with the heartbeat off (WithHeartbeat(false))")
	}
	ds, errs := s.own(ms)
	now := time.Now()
	secs := make([]int32, len(ds), len(ds)+1)
	n := len(ds)
	s.mu.Lock()
	for i, d := range ds {
		if d == nil {
			continue
		}
		left := min(s.vis, d.msg.ReceivedAt.Add(s.cfg.maxExtension).Sub(now))
		secs[i] = d.capped(int32(max((left+time.Second-1)/time.Second, 1)))
		if chain := s.groups[d.msg.Key]; s.q.fifo && len(chain) > 1 && chain[0] == d {
			for _, behind := range chain[1:] {
				ds, secs = append(ds, behind), append(secs, behind.capped(secs[i]))
			}
		}
	}
	s.mu.Unlock()
	got := s.setVisibility(ctx, ds, func(i int) int32 { return secs[i] })
	s.mu.Lock()
	for i, err := range got {
		if err != nil {
			s.stats.heartbeatFailures.Add(1)
			continue
		}
		s.stats.extended.Add(1)
		if i >= n {
			ds[i].renewed = now
		}
	}
	s.mu.Unlock()
	note(ds[:n], errs, got[:n], "extend")
	return driver.PartialOf(errs)
}

// DeadLetter implements driver.Source, as the DeadLetterMode says.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	ds, errs := s.own(ms)
	var left []*delivery // parked, or handed to the redrive policy
	redrive := s.cfg.deadLetterMode == DeadLetterRedrive
	if redrive {
		for i, d := range ds {
			if d != nil {
				s.log.Warn("idemq sqs: dead-lettering through the redrive policy", "queue", s.q.name, "message_id", d.msg.ID,
					"receive_count", d.msg.Attempt, "max_receive_count", s.q.redrive.maxReceiveCount, "cause", deadletter.Cause(causes[i]))
			}
		}
		left = note(ds, errs, s.setVisibility(ctx, ds, atOnce), "dead-letter (release to the redrive policy)")
	} else {
		// SQS accepts a delete with a receipt handle a later receive
		// replaced, and keeps the message, which would be decided again
		// beside its copy. A visibility change, which SQS refuses for such
		// a handle, proves the handle first and keeps the message while
		// copied.
		vis := int32(max(s.vis, time.Second) / time.Second)
		left = note(ds, errs, s.setVisibility(ctx, ds, func(int) int32 { return vis }), "dead-letter (checking the receipt handle; nothing was sent)")
		sent := make([]error, len(ds))
		for i, d := range left {
			if d != nil {
				sent[i] = s.park(ctx, d, causes[i])
			}
		}
		left = note(left, errs, sent, fmt.Sprintf("dead-letter to %q (the message stays in the queue)", s.dlq.name))
		left = note(left, errs, s.deleteAll(ctx, left), fmt.Sprintf("dead-letter: copied to %q but the delete failed, so it will be parked again", s.dlq.name))
	}
	for _, d := range left {
		// Counted once: when the original is gone (a copy whose delete
		// failed comes back and is counted when parked for good), or at the
		// release after which SQS parks it (its receive count passes
		// maxReceiveCount).
		if d != nil && (!redrive || d.msg.Attempt >= s.q.redrive.maxReceiveCount) {
			s.stats.deadLettered.Add(1)
		}
	}
	s.settled(ctx, ds, errs, !redrive)
	return driver.PartialOf(errs)
}

// park sends a copy of d with the bookkeeping attributes to the
// dead-letter queue.
func (s *Source) park(ctx context.Context, d *delivery, cause error) error {
	text := deadletter.Cause(cause) // never empty: SQS refuses an empty attribute
	attrs := unfold(d.raw.MessageAttributes)
	mark := deadletter.Mark{Cause: strings.ToValidUTF8(text[:min(len(text), 1024)], ""), Attempt: d.msg.Attempt, Origin: s.q.name}
	for k, v := range mark.Headers() {
		attrs[k] = stringAttr(v)
	}
	dedup := d.raw.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	if dedup == "" {
		dedup = deduplicationID(d.msg.ID, []byte(aws.ToString(d.raw.Body)))
	}
	return sendCopy(ctx, s.cl, s.dlq, d.raw.Body, attrs, s.cfg.idAttribute, d.msg.Key, "idemq-dead-letters", dedup)
}

// handles returns the receipt handles of ds, nil for a nil delivery.
func handles(ds []*delivery) []*string {
	hs := make([]*string, len(ds))
	for i, d := range ds {
		if d != nil {
			hs[i] = d.raw.ReceiptHandle
		}
	}
	return hs
}

// deleteAll deletes ds (nil ones skipped) and returns the error of each.
func (s *Source) deleteAll(ctx context.Context, ds []*delivery) []error {
	hs := handles(ds)
	call := deletes(s.cl, s.q.url, hs)
	return s.retried(ctx, hs, func(ctx context.Context, idx []int) ([]types.BatchResultErrorEntry, error) {
		s.stats.deleteCalls.Add(1)
		return call(ctx, idx)
	})
}

// setVisibility sets the visibility of each ds[i] (nil ones skipped) to
// secs(i) and returns the error of each.
func (s *Source) setVisibility(ctx context.Context, ds []*delivery, secs func(i int) int32) []error {
	hs := handles(ds)
	return s.retried(ctx, hs, visibility(s.cl, s.q.url, hs, secs))
}

// retried is inBatches with WithSettleRetries, counting what it sent again.
func (s *Source) retried(ctx context.Context, hs []*string, call batchCall) []error {
	errs, resent := inBatches(ctx, hs, s.cfg.settleRetries, call)
	s.stats.settleRetries.Add(int64(resent))
	return errs
}
