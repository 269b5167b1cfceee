package sqs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// newClient builds the SQS client the options describe.
func newClient(ctx context.Context, c clientConfig) (*awssqs.Client, error) {
	if c.client != nil {
		return c.client, nil
	}
	var cfg aws.Config
	var err error
	if c.awsConfig != nil {
		cfg = c.awsConfig.Copy()
	} else if cfg, err = awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(c.region), awsconfig.WithCredentialsProvider(c.credentials)); err != nil {
		return nil, fmt.Errorf("sqs: loading the AWS configuration: %w", err)
	}
	if c.credentials != nil {
		cfg.Credentials = c.credentials
	}
	cfg.Region = cmp.Or(c.region, cfg.Region)
	if cfg.Region == "" && c.endpoint != "" {
		cfg.Region = "us-east-1" // an emulator ignores it, but the SDK signs with it
	}
	if cfg.Region == "" {
		return nil, errors.New("sqs: no AWS region configured: set AWS_REGION or use WithRegion")
	}
	return awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
	}), nil
}

// queueInfo is what the adapter needs to know about a queue.
type queueInfo struct {
	url, name, arn        string
	fifo                  bool
	visibility, retention time.Duration
	redrive               *redrivePolicy
	// maxSize is the queue's MaximumMessageSize in bytes as last read (0:
	// unknown); Publisher.oversized reads it again before it refuses a
	// message.
	maxSize atomic.Int64
}

type redrivePolicy struct {
	targetARN       string
	maxReceiveCount int
}

// queues resolves queues given by URL or name, each once.
type queues struct {
	cl *awssqs.Client
	m  sync.Map
}

func (c *queues) get(ctx context.Context, urlOrName string) (*queueInfo, error) {
	if q, ok := c.m.Load(urlOrName); ok {
		return q.(*queueInfo), nil
	}
	q, err := resolveQueue(ctx, c.cl, urlOrName)
	if err == nil {
		c.m.Store(urlOrName, q)
	}
	return q, err
}

// resolveQueue finds the URL of a queue given by URL or name and reads its
// attributes.
func resolveQueue(ctx context.Context, cl *awssqs.Client, urlOrName string) (*queueInfo, error) {
	if urlOrName == "" {
		return nil, errors.New("empty queue URL or name")
	}
	q := &queueInfo{url: urlOrName}
	if !strings.HasPrefix(urlOrName, "https://") && !strings.HasPrefix(urlOrName, "http://") {
		out, err := cl.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(urlOrName)})
		if err != nil {
			return nil, fmt.Errorf("queue %q: %w", urlOrName, err)
		}
		q.url = aws.ToString(out.QueueUrl)
	}
	if q.name = q.url[strings.LastIndexByte(q.url, '/')+1:]; q.name == "" {
		return nil, fmt.Errorf("queue URL %q names no queue", q.url)
	}
	attrs, err := cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(q.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		return nil, fmt.Errorf("queue %q: reading attributes: %w", q.name, err)
	}
	a := attrs.Attributes
	q.arn = a[string(types.QueueAttributeNameQueueArn)]
	q.fifo = a[string(types.QueueAttributeNameFifoQueue)] == "true" || strings.HasSuffix(q.name, ".fifo")
	seconds := func(name types.QueueAttributeName) time.Duration {
		n, _ := strconv.Atoi(a[string(name)])
		return time.Duration(n) * time.Second
	}
	q.retention = seconds(types.QueueAttributeNameMessageRetentionPeriod)
	if q.visibility = seconds(types.QueueAttributeNameVisibilityTimeout); q.visibility <= 0 {
		q.visibility = 30 * time.Second // the SQS default
	}
	if s := a[string(types.QueueAttributeNameRedrivePolicy)]; s != "" {
		if q.redrive, err = parseRedrivePolicy(s); err != nil {
			return nil, fmt.Errorf("queue %q: RedrivePolicy: %w", q.name, err)
		}
	}
	q.maxSize.Store(maxMessageSize(a))
	return q, nil
}

// maxMessageSize is the MaximumMessageSize among queue attributes a, 0
// when missing or unreadable.
func maxMessageSize(a map[string]string) int64 {
	n, _ := strconv.ParseInt(a[string(types.QueueAttributeNameMaximumMessageSize)], 10, 64)
	return max(n, 0)
}

// parseRedrivePolicy reads {"deadLetterTargetArn":"…","maxReceiveCount":5};
// SQS returns maxReceiveCount as a number or a string.
func parseRedrivePolicy(s string) (*redrivePolicy, error) {
	var raw struct {
		Target string      `json:"deadLetterTargetArn"`
		Max    json.Number `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, err
	}
	if raw.Target == "" {
		return nil, errors.New("no deadLetterTargetArn")
	}
	n, _ := raw.Max.Float64()
	return &redrivePolicy{targetARN: raw.Target, maxReceiveCount: int(n)}, nil
}

// queueNameFromARN returns the last part of arn:aws:sqs:region:account:name.
func queueNameFromARN(arn string) string {
	return arn[strings.LastIndexByte(arn, ':')+1:]
}

// deadLetterQueue finds the dead-letter queue of q under cfg's mode: the
// one WithDeadLetterQueue names, else the redrive policy's target (always
// the latter for DeadLetterRedrive). It must be FIFO exactly when q is.
// Unless resolve, it only checks that the mode has one.
func deadLetterQueue(ctx context.Context, cfg *config, cl *awssqs.Client, q *queueInfo, resolve bool) (*queueInfo, error) {
	option, target := "WithDeadLetterQueue", cfg.deadLetterQueue
	if q.redrive != nil && (target == "" || cfg.deadLetterMode == DeadLetterRedrive) {
		target = queueNameFromARN(q.redrive.targetARN)
	}
	if cfg.deadLetterMode == DeadLetterRedrive {
		option = "WithDeadLetterMode"
		if q.redrive == nil {
			return nil, cfg.optErr(option, "%s needs a redrive policy on queue %q", cfg.spell("DeadLetterRedrive", "redrive"), q.name)
		}
	}
	if target == "" {
		return nil, cfg.optErr(option, "queue %q has no redrive policy, so name the dead-letter queue (or use %s on a queue that has one)",
			q.name, cfg.spell("WithDeadLetterMode(DeadLetterRedrive)", "dead_letter_mode=redrive"))
	}
	if !resolve {
		return nil, nil
	}
	dlq, err := resolveQueue(ctx, cl, target)
	if err != nil {
		return nil, cfg.optErr(option, "%v", err)
	}
	if dlq.fifo != q.fifo {
		return nil, cfg.optErr(option, "dead-letter queue %q and queue %q must both be FIFO or both standard", dlq.name, q.name)
	}
	return dlq, nil
}
