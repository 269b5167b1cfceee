package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
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
			ref := &refuser{}
			cl := awssqs.New(testClient(ep).Options(), func(o *awssqs.Options) { o.HTTPClient = &http.Client{Transport: ref} })
			all := append(clientOpts(ep), WithClient(cl), WithLogger(testLogger(t)), WithWaitTime(time.Second))
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
				Reconnect: func(t *testing.T, src driver.Source) { lapseVisibility(t, ref, src.(*Source)) },
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

// refuser fails the ChangeMessageVisibilityBatch requests it carries
// while refusing is set, as if SQS were out of reach for them: the
// heartbeat's extensions fail.
type refuser struct{ refusing atomic.Bool }

func (r *refuser) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.refusing.Load() && req.Header.Get("X-Amz-Target") == "AmazonSQS.ChangeMessageVisibilityBatch" {
		return nil, errors.New("the test refuses visibility changes")
	}
	return http.DefaultTransport.RoundTrip(req)
}

// lapseVisibility lets the visibility of every message s's Consumer
// holds lapse, as when the heartbeat's extensions fail: it returns once
// no extension made before it began can hold them any longer, so SQS
// hands them out again (fauxqs makes them visible at the next receive)
// and the old deliveries are stale.
func lapseVisibility(t *testing.T, ref *refuser, s *Source) {
	start := time.Now()
	ref.refusing.Store(true)
	defer ref.refusing.Store(false)
	servicetest.WaitFor(t, s.vis+10*time.Second, "the visibility to lapse", func() bool { return time.Since(start) > s.vis })
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
