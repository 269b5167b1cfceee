package sqs

import (
	"context"
	"encoding/base64"
	"fmt"
	"iter"
	"log/slog"
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
	"github.com/idemq/idemq/core/driver/retry"
)

// MetadataMessageGroupID is the Message.Metadata key of a FIFO message's
// MessageGroupId (OpenTelemetry's conventions name none).
const MetadataMessageGroupID = "messaging.aws_sqs.message_group_id"

// delivery is one received message: its AckID.
type delivery struct {
	msg      driver.Message
	src      *Source
	raw      *types.Message // msg.Key is its MessageGroupId
	received time.Time      // when SQS handed it out: its twelve hours of visibility count from then
	renewed  time.Time      // FIFO, held back: when its visibility was last set; guarded by src.mu
}

func (s *Source) newDelivery(m *types.Message, now time.Time) *delivery {
	sys := m.Attributes
	attempt := 1
	if n, err := strconv.Atoi(sys[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		attempt = n
	}
	headers, body := decode(m)
	d := &delivery{src: s, raw: m, received: now, renewed: now,
		msg: driver.Message{ID: headers[s.cfg.idAttribute], Body: body, Headers: headers, Source: s.q.name, System: "aws_sqs",
			Key: sys[string(types.MessageSystemAttributeNameMessageGroupId)], Attempt: attempt, ReceivedAt: now, BrokerKey: aws.ToString(m.MessageId)}}
	d.msg.AckID, d.msg.Metadata = d, (*metadata)(d)
	return d
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the queue's name and URL, the SQS MessageId and, for a FIFO
// queue, the message group.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		q := m.src.q
		if !(yield(string(semconv.MessagingDestinationNameKey), slog.StringValue(q.name)) &&
			yield(string(semconv.MessagingMessageIDKey), slog.StringValue(aws.ToString(m.raw.MessageId))) &&
			yield(string(semconv.AWSSQSQueueURLKey), slog.StringValue(q.url))) {
			return
		}
		if m.msg.Key != "" {
			yield(MetadataMessageGroupID, slog.StringValue(m.msg.Key))
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

func (d *delivery) wrap(err error) error {
	return fmt.Errorf("sqs: message %q (%s): %w", d.msg.ID, aws.ToString(d.raw.MessageId), err)
}

// capped returns secs, less where fewer are left of SQS's twelve hours of
// visibility since the receipt.
func (d *delivery) capped(secs int32) int32 {
	left := int32((12*time.Hour - time.Since(d.received)) / time.Second)
	return max(min(secs, left-1), 0)
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

// batchCall sends one batch request of the entries idx names (each
// entry's Id is its place in idx) and returns those SQS failed.
type batchCall func(ctx context.Context, idx []int) ([]types.BatchResultErrorEntry, error)

// deletes is a DeleteMessageBatch of handles.
func deletes(cl *awssqs.Client, queueURL string, handles []*string) batchCall {
	return func(ctx context.Context, idx []int) ([]types.BatchResultErrorEntry, error) {
		entries := make([]types.DeleteMessageBatchRequestEntry, len(idx))
		for j, i := range idx {
			entries[j] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: handles[i]}
		}
		out, err := cl.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
		if err != nil {
			return nil, err
		}
		return out.Failed, nil
	}
}

// visibility is a ChangeMessageVisibilityBatch setting handles[i]'s
// visibility to secs(i).
func visibility(cl *awssqs.Client, queueURL string, handles []*string, secs func(i int) int32) batchCall {
	return func(ctx context.Context, idx []int) ([]types.BatchResultErrorEntry, error) {
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(idx))
		for j, i := range idx {
			entries[j] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: handles[i], VisibilityTimeout: secs(i)}
		}
		out, err := cl.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
		if err != nil {
			return nil, err
		}
		return out.Failed, nil
	}
}

// atOnce is the visibility of a message made visible again at once.
func atOnce(int) int32 { return 0 }

// inBatches sends the entries of handles that are not nil through call ten
// at a time, sending a failed entry (or a failed request's entries) again
// up to retries times unless it would fail the same way again. It returns
// the last error of each entry that never succeeded (stale where SQS
// refused its receipt handle) and how many it sent again.
func inBatches(ctx context.Context, handles []*string, retries int, call batchCall) (errs []error, resent int) {
	errs = make([]error, len(handles))
	var idx []int
	for i, h := range handles {
		if h != nil {
			idx = append(idx, i)
		}
	}
	_, resent = resending(ctx, idx, retries, func(idx []int) (again []int) {
		for chunk := range slices.Chunk(idx, 10) {
			failed, err := call(ctx, chunk)
			for _, i := range chunk {
				errs[i] = err
			}
			if err != nil {
				again = append(again, chunk...)
				continue
			}
			for _, f := range failed {
				j, err := strconv.Atoi(aws.ToString(f.Id))
				if err != nil || j < 0 || j >= len(chunk) {
					continue
				}
				code, msg := aws.ToString(f.Code), aws.ToString(f.Message)
				if errs[chunk[j]] = fmt.Errorf("%s: %s", code, msg); receiptGone(code, msg) {
					errs[chunk[j]] = driver.Stale(errs[chunk[j]])
				}
				if code != "InvalidParameterValue" && !receiptGone(code, "") {
					again = append(again, chunk[j])
				}
			}
		}
		return again
	})
	return errs, resent
}

// resending calls send with idx, then with the entries it returns to send
// again, up to retries more times with a doubling pause, and returns those
// still to send and how many it sent again.
func resending(ctx context.Context, idx []int, retries int, send func(idx []int) (again []int)) (left []int, resent int) {
	pause := retry.New(settlePause, settlePause<<maxSettleRetries)
	for try := 0; len(idx) > 0; try++ {
		again := send(idx)
		if len(again) == 0 || try >= retries || ctx.Err() != nil {
			return again, resent
		}
		if resent += len(again); !pause.Wait(ctx) {
			return again, resent
		}
		idx = again
	}
	return nil, resent
}
