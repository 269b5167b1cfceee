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
	"github.com/idemq/idemq/internal/retry"
)

// ErrClosed is wrapped, with driver.ErrStaleDelivery, by the error of a
// settlement or extension after Close: nothing is sent, and SQS hands the
// message out again once its visibility lapses.
var ErrClosed = errors.New("sqs: source closed")

// own returns the deliveries of ms, nil for a message that is not this
// Source's or after Close, and the errors of the call, set for those.
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

// note sets errs[i], worded by what, for each ds[i] that failed a step
// (got[i] is its error), and returns ds without those.
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
	note(ds, errs, s.batch(ctx, ds, s.deletes(ds)), "delete")
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
	got := s.batch(ctx, ds, s.visibility(ds, func(i int) int32 { return ds[i].capped(secs) }))
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
		if chain := s.groups[d.group]; s.q.fifo && len(chain) > 1 && chain[0] == d {
			for _, behind := range chain[1:] {
				ds, secs = append(ds, behind), append(secs, behind.capped(secs[i]))
			}
		}
	}
	s.mu.Unlock()
	got := s.batch(ctx, ds, s.visibility(ds, func(i int) int32 { return secs[i] }))
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
	if s.cfg.deadLetterMode == DeadLetterRedrive {
		for i, d := range ds {
			if d != nil {
				s.log.Warn("idemq sqs: dead-lettering through the redrive policy", "queue", s.q.name, "message_id", d.msg.ID,
					"receive_count", d.msg.Attempt, "max_receive_count", s.q.redrive.maxReceiveCount, "cause", deadletter.Cause(causes[i]))
			}
		}
		released := note(ds, errs, s.batch(ctx, ds, s.visibility(ds, func(int) int32 { return 0 })), "dead-letter (release to the redrive policy)")
		for _, d := range released {
			// SQS parks it once its receive count passes maxReceiveCount:
			// count that receive, not every release before it.
			if d != nil && d.msg.Attempt >= s.q.redrive.maxReceiveCount {
				s.stats.deadLettered.Add(1)
			}
		}
		s.settled(ctx, ds, errs, false)
		return driver.PartialOf(errs)
	}
	// SQS accepts a delete with a receipt handle a later receive replaced,
	// and keeps the message, which would be decided again beside its copy.
	// A visibility change, which SQS refuses for such a handle, proves the
	// handle before anything is sent and keeps the message while copied.
	vis := int32(max(s.vis, time.Second) / time.Second)
	left := note(ds, errs, s.batch(ctx, ds, s.visibility(ds, func(int) int32 { return vis })), "dead-letter (checking the receipt handle; nothing was sent)")
	sent := make([]error, len(ds))
	for i, d := range left {
		if d != nil {
			sent[i] = s.park(ctx, d, causes[i])
		}
	}
	left = note(left, errs, sent, fmt.Sprintf("dead-letter to %q (the message stays in the queue)", s.dlq.name))
	left = note(left, errs, s.batch(ctx, left, s.deletes(left)), fmt.Sprintf("dead-letter: copied to %q but the delete failed, so it will be parked again", s.dlq.name))
	for _, d := range left {
		// Counted once the original is gone: a copy whose delete failed
		// comes back and is counted when it is parked for good.
		if d != nil {
			s.stats.deadLettered.Add(1)
		}
	}
	s.settled(ctx, ds, errs, true)
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
	return sendCopy(ctx, s.cl, s.dlq, d.raw.Body, attrs, s.cfg.idAttribute, d.group, "idemq-dead-letters", dedup)
}

// batchCall sends one request for up to ten of its deliveries (their
// indices) and returns the entries that failed by their place in idx.
type batchCall func(ctx context.Context, idx []int) (map[int]entryErr, error)

// deletes is a DeleteMessageBatch of ds.
func (s *Source) deletes(ds []*delivery) batchCall {
	return func(ctx context.Context, idx []int) (map[int]entryErr, error) {
		s.stats.deleteCalls.Add(1)
		return deleteReceipts(ctx, s.cl, s.q.url, receipts(ds, idx))
	}
}

// visibility is a ChangeMessageVisibilityBatch setting ds[i]'s visibility
// to secs(i).
func (s *Source) visibility(ds []*delivery, secs func(i int) int32) batchCall {
	return func(ctx context.Context, idx []int) (map[int]entryErr, error) {
		return visibilityBatch(ctx, s.cl, s.q.url, receipts(ds, idx), func(j int) int32 { return secs(idx[j]) })
	}
}

func receipts(ds []*delivery, idx []int) []string {
	out := make([]string, len(idx))
	for j, i := range idx {
		out[j] = aws.ToString(ds[i].raw.ReceiptHandle)
	}
	return out
}

// batch runs call over ds (skipping nil ones) ten at a time, sending a
// failed entry (or a failed request's entries) again up to
// WithSettleRetries times with a doubling pause unless it failed for good.
// It returns the last error of each delivery that never succeeded.
func (s *Source) batch(ctx context.Context, ds []*delivery, call batchCall) []error {
	errs := make([]error, len(ds))
	var idx []int
	for i, d := range ds {
		if d != nil {
			idx = append(idx, i)
		}
	}
	pause := retry.New(settlePause, settlePause<<maxSettleRetries)
	for try := 0; len(idx) > 0; try++ {
		var again []int
		for chunk := range slices.Chunk(idx, 10) {
			failed, err := call(ctx, chunk)
			for j, i := range chunk {
				e, bad := failed[j]
				switch {
				case err != nil:
					errs[i] = err
					again = append(again, i)
				case !bad:
					errs[i] = nil
				default:
					errs[i] = e.err
					if !e.permanent {
						again = append(again, i)
					}
				}
			}
		}
		if len(again) == 0 || try >= s.cfg.settleRetries || ctx.Err() != nil {
			break
		}
		s.stats.settleRetries.Add(int64(len(again)))
		if !pause.Wait(ctx) {
			break
		}
		idx = again
	}
	return errs
}
