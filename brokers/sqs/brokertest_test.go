package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// harness runs the conformance suite with the given Source options; every
// fixture gets its own queue and dead-letter queue. The queue's visibility
// timeout is 5s, so a message that is not released or settled would not
// come back within the suite's receive timeout by accident.
func harness(redrive bool, opts ...Option) brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:        !redrive,
		CarriesKey:          false, // a standard queue has no MessageGroupId
		OperatesDeadLetters: true,
		Open: func(t *testing.T) *brokertest.Fixture {
			ep := sqsEndpoint(t)
			maxReceives := 0
			if redrive {
				// DeadLetterRedrive parks a message once its receive count
				// passes 1: the dead-lettered message is received once more
				// by SQS's redrive and moved.
				maxReceives = 1
			}
			q, dlq := newQueueWithDLQ(t, ep, false, 5, maxReceives)
			all := append(clientOpts(ep), WithLogger(testLogger(t)), WithWaitTime(time.Second))
			params := "&wait=1s"
			if !redrive {
				all = append(all, WithDeadLetterQueue(dlq.name))
				params += "&dlq=" + dlq.name
			} else {
				params += "&dead_letter_mode=redrive"
			}
			all = append(all, opts...)
			pub, err := NewPublisher(context.Background(), q.addr(), publisherOpts(ep)...)
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			base := fmt.Sprintf("sqs://test:test@%s?region=us-east-1&endpoint=%s", q.name, url.QueryEscape(ep))
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error { return pub.Publish(ctx, "", msgs...) },
				NewSource: func(t *testing.T) driver.Source {
					s, err := Open(context.Background(), q.addr(), all...)
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					return s
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, m := range drain(t, ep, dlq.url) {
						out = append(out, brokertest.DeadLetter{
							ID:    attr(m, DefaultIDAttribute),
							Body:  []byte(*m.Body),
							Cause: attr(m, driver.CauseHeader),
						})
					}
					return out, nil
				},
				Reconnect: lapseVisibility,
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), q.addr(), publisherOpts(ep)...)
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw:          func(ctx context.Context) (brokertest.RawMessage, error) { return rawReceive(ctx, ep, q.url) },
				SourceURL:    base + params,
				PublisherURL: base,
			}
		},
	}
}

// lapseVisibility lets the visibility of every delivery src holds lapse,
// as when SQS refuses the heartbeat's extensions for good: the heartbeat
// stops extending them, and it returns once their visibility timeout has
// passed, so SQS hands the messages out again (to src, whose receivers
// keep polling) and the old deliveries are stale.
func lapseVisibility(t *testing.T, src driver.Source) {
	s := src.(*Source)
	var last time.Time
	for _, e := range s.live.All() {
		s.live.GiveUp(e)
		last = maxTime(last, s.live.Lapses(e))
	}
	servicetest.WaitFor(t, s.vis+10*time.Second, "the visibility to lapse", func() bool { return time.Now().After(last) })
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// rawReceive takes the next message off the queue with the SDK alone and
// deletes it.
func rawReceive(ctx context.Context, ep, queueURL string) (brokertest.RawMessage, error) {
	cl := testClient(ep)
	for ctx.Err() == nil {
		out, err := cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 1, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return brokertest.RawMessage{}, err
		}
		if len(out.Messages) == 0 {
			continue
		}
		m := out.Messages[0]
		if _, err := cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
			return brokertest.RawMessage{}, err
		}
		raw := brokertest.RawMessage{
			ID:      attr(m, DefaultIDAttribute),
			Key:     m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
			Headers: map[string]string{},
			Body:    []byte(aws.ToString(m.Body)),
		}
		for k := range m.MessageAttributes {
			raw.Headers[k] = attr(m, k)
		}
		return raw, nil
	}
	return brokertest.RawMessage{}, errors.New("no message before " + strings.TrimSpace(ctx.Err().Error()))
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, harness(false))
}

// TestConformanceRedrivePolicy runs the dead-letter queue cases with
// DeadLetterRedrive: SQS moves dead-lettered messages itself, and the
// dead-letter queue API finds them in the redrive policy's target. The
// rest of the suite does not fit this mode: with a maxReceiveCount of 1
// SQS parks every message received twice, retried ones included.
func TestConformanceRedrivePolicy(t *testing.T) {
	brokertest.RunDeadLetters(t, harness(true))
}
