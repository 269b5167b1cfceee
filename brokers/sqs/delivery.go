package sqs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
	"github.com/idemq/idemq/internal/retry"
)

// MetadataMessageGroupID is the Message.Metadata key of a FIFO message's
// MessageGroupId (OpenTelemetry's conventions name none).
const MetadataMessageGroupID = "messaging.aws_sqs.message_group_id"

// delivery is one received message and its receipt handle.
type delivery struct {
	e          *unsettled.Entry[string, *delivery]
	src        *Source
	msg        *driver.Message
	raw        *types.Message
	receipt    string
	group      string
	ext        int32      // the heartbeat's: the extension asked for, in seconds
	hbFailures int        // the heartbeat's: extensions refused in a row
	acked      chan error // a single Ack's delete, from a deleter
}

func (s *Source) newDelivery(m *types.Message, now time.Time) *delivery {
	sys := m.Attributes
	attempt := 1
	if n, err := strconv.Atoi(sys[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		attempt = n
	}
	headers, body := decode(m)
	group := sys[string(types.MessageSystemAttributeNameMessageGroupId)]
	d := &delivery{src: s, raw: m, receipt: aws.ToString(m.ReceiptHandle), group: group,
		msg: &driver.Message{ID: headers[s.cfg.idAttribute], Body: body, Headers: headers, Key: group, Source: s.q.name,
			System: "aws_sqs", Attempt: attempt, ReceivedAt: now}}
	d.msg.Metadata = (*metadata)(d)
	return d
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the queue's name and URL, the SQS MessageId and, for a FIFO
// queue, the message group.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		q := m.src.q
		if !(yield(string(semconv.MessagingDestinationNameKey), q.name) &&
			yield(string(semconv.MessagingMessageIDKey), aws.ToString(m.raw.MessageId)) &&
			yield(string(semconv.AWSSQSQueueURLKey), q.url)) {
			return
		}
		if m.group != "" {
			yield(MetadataMessageGroupID, m.group)
		}
	}
}

// decode returns a message's headers (its attributes, unfolded) and body
// (decoded when Publisher encoded it).
func decode(m *types.Message) (map[string]string, []byte) {
	attrs := unfold(m.MessageAttributes)
	headers := make(map[string]string, len(attrs))
	for k, v := range attrs {
		switch {
		case v.StringValue != nil:
			headers[k] = *v.StringValue
		case v.BinaryValue != nil:
			headers[k] = string(v.BinaryValue)
		}
	}
	body := []byte(aws.ToString(m.Body))
	if headers[AttributeEncoding] == "base64" {
		if dec, err := base64.StdEncoding.DecodeString(string(body)); err == nil {
			body = dec
		}
	}
	return headers, body
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return d.msg }

func (d *delivery) wrap(err error) error {
	return fmt.Errorf("sqs: message %q (%s): %w", d.msg.ID, aws.ToString(d.raw.MessageId), err)
}

// claim claims the right to settle d. A stale delivery is not settled: the
// caller sends nothing, since SQS redelivers the message.
func (d *delivery) claim() error {
	err := d.src.live.Settle(d.e)
	if errors.Is(err, driver.ErrStaleDelivery) {
		d.src.finish(d, true)
	}
	if err != nil {
		return d.wrap(err)
	}
	return nil
}

// Ack implements driver.Delivery: a DeleteMessageBatch entry, retried as
// AckBatch retries, sent together with other Acks made at the same time.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.claim(); err != nil {
		return err
	}
	s := d.src
	var err error
	d.acked = make(chan error, 1)
	select {
	case s.acks <- d:
		select {
		case err = <-d.acked:
		case <-ctx.Done():
			err = ctx.Err() // the delete is still sent; the caller stops waiting
		}
	case <-s.ctx.Done(): // the deleters stopped
		err = s.deleteBatch(ctx, []*delivery{d})[d]
	case <-ctx.Done():
		err = ctx.Err() // not sent: SQS redelivers it
	}
	s.finish(d, false)
	if err != nil {
		return d.wrap(fmt.Errorf("delete: %w", err))
	}
	return nil
}

// Retry implements driver.Delivery: the message's visibility becomes delay,
// in whole seconds up to what is left of SQS's 12 hours from the receipt.
// On a FIFO queue, the messages held back behind it are released.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if err := d.claim(); err != nil {
		return err
	}
	secs := int32((max(delay, 0) + time.Second - 1) / time.Second)
	if left := int32((12*time.Hour - time.Since(d.e.Received)) / time.Second); secs > left-1 {
		secs = max(left-1, 0)
	}
	err := d.setVisibility(ctx, secs)
	d.src.finish(d, true)
	if err != nil {
		return d.wrap(staleIfGone(fmt.Errorf("retry (visibility %ds): %w; it comes back when its visibility timeout lapses", secs, err)))
	}
	return nil
}

func (d *delivery) setVisibility(ctx context.Context, secs int32) error {
	_, err := d.src.cl.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.src.q.url), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: secs})
	return err
}

// DeadLetter implements driver.Delivery, as the DeadLetterMode says.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.claim(); err != nil {
		return err
	}
	s := d.src
	text := deadletter.Cause(cause) // never empty: SQS refuses an empty attribute
	if s.cfg.deadLetterMode == DeadLetterRedrive {
		s.log().Warn("idemq sqs: dead-lettering through the redrive policy", "queue", s.q.name, "message_id", d.msg.ID,
			"receive_count", d.msg.Attempt, "max_receive_count", s.q.redrive.maxReceiveCount, "cause", text)
		err := d.setVisibility(ctx, 0)
		s.finish(d, true)
		if err != nil {
			return d.wrap(staleIfGone(fmt.Errorf("dead-letter (release to the redrive policy): %w", err)))
		}
		// SQS parks it once its receive count passes maxReceiveCount: count
		// that receive, not every release before it.
		if d.msg.Attempt >= s.q.redrive.maxReceiveCount {
			s.stats.deadLettered.Add(1)
		}
		return nil
	}
	// SQS accepts a delete with a receipt handle a later receive replaced,
	// and keeps the message, which would be decided again beside its copy.
	// A visibility change, which SQS refuses for such a handle, proves the
	// handle before anything is sent and keeps the message while copied.
	if err := d.setVisibility(ctx, int32(max(s.vis, time.Second)/time.Second)); err != nil {
		s.finish(d, true)
		return d.wrap(staleIfGone(fmt.Errorf("dead-letter (checking the receipt handle; nothing was sent): %w", err)))
	}
	attrs := unfold(d.raw.MessageAttributes)
	mark := deadletter.Mark{Cause: strings.ToValidUTF8(text[:min(len(text), 1024)], ""), Attempt: d.msg.Attempt, Origin: s.q.name}
	for k, v := range mark.Headers() {
		attrs[k] = stringAttr(v)
	}
	dedup := d.raw.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	if dedup == "" {
		dedup = deduplicationID(d.msg.ID, []byte(aws.ToString(d.raw.Body)))
	}
	if err := sendCopy(ctx, s.cl, s.dlq, d.raw.Body, attrs, s.cfg.idAttribute, d.group, "idemq-dead-letters", dedup); err != nil {
		s.finish(d, true)
		return d.wrap(fmt.Errorf("dead-letter to %q (the message stays in the queue): %w", s.dlq.name, err))
	}
	failed := s.deleteBatch(ctx, []*delivery{d})
	s.finish(d, false)
	if err := failed[d]; err != nil {
		return d.wrap(fmt.Errorf("dead-letter: copied to %q but the delete failed, so it will be parked again: %w", s.dlq.name, err))
	}
	// Counted once the original is gone: a copy whose delete failed comes
	// back and is counted when it is parked for good.
	s.stats.deadLettered.Add(1)
	return nil
}

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// sendCopy sends body with attrs to q, folding what does not fit beside the
// bookkeeping, the id and the trace context; on a FIFO queue to group
// (else fallback) under dedup.
func sendCopy(ctx context.Context, cl *awssqs.Client, q *queueInfo, body *string, attrs map[string]types.MessageAttributeValue, idAttribute, group, fallback, dedup string) error {
	attrs = fold(attrs, slices.Concat(deadletter.Bookkeeping, []string{idAttribute, AttributeEncoding, "traceparent", "tracestate"})...)
	in := &awssqs.SendMessageInput{QueueUrl: aws.String(q.url), MessageBody: body}
	if len(attrs) > 0 {
		in.MessageAttributes = attrs
	}
	if q.fifo {
		if group == "" {
			group = fallback
		}
		in.MessageGroupId, in.MessageDeduplicationId = aws.String(group), aws.String(dedup)
	}
	_, err := cl.SendMessage(ctx, in)
	return err
}

// apiError is an SQS error's code and message.
func apiError(err error) (code, msg string) {
	var ae interface {
		ErrorCode() string
		ErrorMessage() string
	}
	if errors.As(err, &ae) {
		return ae.ErrorCode(), ae.ErrorMessage()
	}
	return "", ""
}

// receiptGone reports whether SQS refused a request because the receipt
// handle names no in-flight message: the delivery is stale (an expired
// handle gets InvalidParameterValue naming it).
func receiptGone(code, msg string) bool {
	switch code {
	case "ReceiptHandleIsInvalid", "InvalidReceiptHandle", "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight":
		return true
	case "InvalidParameterValue":
		m := strings.ToLower(msg)
		return strings.Contains(m, "receipt handle") || strings.Contains(m, "receipthandle")
	}
	return false
}

// staleIfGone marks err driver.Stale when SQS refused the receipt handle.
func staleIfGone(err error) error {
	if receiptGone(apiError(err)) {
		return driver.Stale(err)
	}
	return err
}

// deleteBatch deletes ds; it returns the error of each not deleted.
func (s *Source) deleteBatch(ctx context.Context, ds []*delivery) map[*delivery]error {
	return s.batchCall(ctx, ds, func(ctx context.Context, chunk []*delivery) (map[int]entryErr, error) {
		receipts := make([]string, len(chunk))
		for i, d := range chunk {
			receipts[i] = d.receipt
		}
		s.stats.deleteCalls.Add(1)
		return deleteReceipts(ctx, s.cl, s.q.url, receipts)
	})
}

// deleteReceipts deletes up to ten receipt handles' messages in one
// DeleteMessageBatch call.
func deleteReceipts(ctx context.Context, cl *awssqs.Client, queueURL string, receipts []string) (map[int]entryErr, error) {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(receipts))
	for i, r := range receipts {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r)}
	}
	out, err := cl.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
	if err != nil {
		return nil, err
	}
	return entryErrors(out.Failed), nil
}

// changeVisibility sets the visibility of up to ten deliveries.
func (s *Source) changeVisibility(ctx context.Context, chunk []*delivery, secs func(*delivery) int32) (map[int]entryErr, error) {
	receipts := make([]string, len(chunk))
	for i, d := range chunk {
		receipts[i] = d.receipt
	}
	return visibilityBatch(ctx, s.cl, s.q.url, receipts, func(i int) int32 { return secs(chunk[i]) })
}

// visibilityBatch sets the visibility of up to ten receipt handles in one
// ChangeMessageVisibilityBatch call.
func visibilityBatch(ctx context.Context, cl *awssqs.Client, queueURL string, receipts []string, secs func(int) int32) (map[int]entryErr, error) {
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(receipts))
	for i, r := range receipts {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r), VisibilityTimeout: secs(i)}
	}
	out, err := cl.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
	if err != nil {
		return nil, err
	}
	return entryErrors(out.Failed), nil
}

// entryErr is one failed entry of a batch call.
type entryErr struct {
	permanent bool // it would fail the same way again
	gone      bool // the receipt handle is no longer valid: stale
	err       error
}

func entryErrors(failed []types.BatchResultErrorEntry) map[int]entryErr {
	out := make(map[int]entryErr, len(failed))
	for _, f := range failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil {
			continue
		}
		code, msg := aws.ToString(f.Code), aws.ToString(f.Message)
		e := entryErr{gone: receiptGone(code, msg), err: fmt.Errorf("%s: %s", code, msg)}
		e.permanent = code == "InvalidParameterValue" || receiptGone(code, "")
		if e.gone {
			e.err = driver.Stale(e.err)
		}
		out[i] = e
	}
	return out
}

// batchCall runs call over ds in chunks of ten, sending a failed entry (or
// a failed call's chunk) again up to WithSettleRetries times with a
// doubling pause unless it failed for good. It returns the last error of
// each delivery that never succeeded.
func (s *Source) batchCall(ctx context.Context, ds []*delivery, call func(context.Context, []*delivery) (map[int]entryErr, error)) map[*delivery]error {
	failed := map[*delivery]error{}
	pause := retry.New(settlePause, settlePause<<maxSettleRetries)
	for try := 0; len(ds) > 0; try++ {
		var again []*delivery
		for start := 0; start < len(ds); start += 10 {
			chunk := ds[start:min(start+10, len(ds))]
			errsByIndex, err := call(ctx, chunk)
			for i, d := range chunk {
				e, bad := errsByIndex[i]
				switch {
				case err != nil:
					failed[d] = err
					again = append(again, d)
				case !bad:
					delete(failed, d)
				default:
					failed[d] = e.err
					if !e.permanent {
						again = append(again, d)
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
		ds = again
	}
	return failed
}
