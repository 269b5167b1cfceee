package benchmark

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	_ "github.com/idemq/idemq/brokers/sqs" // the sqs:// scheme of core.OpenSource
)

// sqsMaxBatch is the most messages one ReceiveMessage returns and one
// DeleteMessageBatch deletes.
const sqsMaxBatch = 10

// sqsIDAttribute is the message attribute idemq's SQS adapter reads the
// business id from by default (sqs.DefaultIDAttribute).
const sqsIDAttribute = "message-id"

// sqsBroker is the SQS side of a run: an aws-sdk-go-v2 client for the raw
// consumers and for setup, and the user's idemq URL to reopen with another
// queue. Every run creates its own queue and dead-letter queue
// (QUEUE-dlq) and deletes them afterwards.
type sqsBroker struct {
	idemqURL *url.URL
	base     string
	endpoint string
	cl       *awssqs.Client
	urls     sync.Map // queue name → queue URL
}

func newSQS(ctx context.Context, u *url.URL) (*sqsBroker, error) {
	s := &sqsBroker{idemqURL: u, base: u.Host}
	if p := strings.Trim(u.Path, "/"); p != "" {
		s.base = p[strings.LastIndex(p, "/")+1:] // a queue URL: its name
	}
	if s.base == "" {
		return nil, errors.New("benchmark: Config.Broker: the sqs:// URL has no queue (sqs://QUEUE?endpoint=…)")
	}
	q := u.Query()
	s.endpoint = q.Get("endpoint")
	var loads []func(*awsconfig.LoadOptions) error
	if r := q.Get("region"); r != "" {
		loads = append(loads, awsconfig.WithRegion(r))
	}
	if u.User != nil {
		secret, _ := u.User.Password()
		loads = append(loads, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(u.User.Username(), secret, "")))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Broker: loading the AWS configuration: %v", err)
	}
	if cfg.Region == "" && s.endpoint != "" {
		cfg.Region = "us-east-1" // an emulator ignores it, the SDK needs one to sign
	}
	s.cl = awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		if s.endpoint != "" {
			o.BaseEndpoint = aws.String(s.endpoint)
		}
	})
	return s, nil
}

func (s *sqsBroker) kind() string      { return "SQS" }
func (s *sqsBroker) baseQueue() string { return s.base }
func (s *sqsBroker) close()            {}

func (s *sqsBroker) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.cl.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	return err
}

func (s *sqsBroker) version(context.Context) string {
	if s.endpoint != "" {
		return "SQS API at " + s.endpoint + " (aws-sdk-go-v2 client)"
	}
	return "Amazon SQS (aws-sdk-go-v2 client)"
}

func (s *sqsBroker) describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw drivers): receive up to 5, then per message 1 tx + DeleteMessage; 1 worker"
	case SeedP100W8:
		return "seed pattern (raw drivers): receive up to 10, then per message 1 tx + DeleteMessage; 8 workers"
	case HandBatch:
		return "hand-tuned batch (raw drivers): receive up to 10, 1 claim + 1 set-based UPDATE + 1 commit + 1 DeleteMessageBatch"
	case RawAck:
		return "broker only: receive up to 10 + 1 DeleteMessageBatch, no database"
	}
	return ""
}

// sourceURL is Config.Broker with its queue replaced by queue and, unless
// the URL says otherwise, queue-dlq as the dead-letter queue and a 1s long
// poll (wait=1s) as the raw consumers use: with the adapter's 20s default,
// Close waits for the last poll (so as not to strand received messages)
// and every idemq run would end 20s late.
func (s *sqsBroker) sourceURL(queue, _ string) string {
	u := *s.idemqURL
	if p := strings.Trim(u.Path, "/"); p != "" {
		u.Path = "/" + p[:strings.LastIndex(p, "/")+1] + queue
	} else {
		u.Host = queue
	}
	q := u.Query()
	if !q.Has("dlq") && !q.Has("dead_letter_mode") {
		q.Set("dlq", queue+"-dlq")
	}
	if !q.Has("wait") {
		q.Set("wait", "1s")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func (s *sqsBroker) queueURL(ctx context.Context, queue string) (string, error) {
	if v, ok := s.urls.Load(queue); ok {
		return v.(string), nil
	}
	out, err := s.cl.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		return "", err
	}
	s.urls.Store(queue, aws.ToString(out.QueueUrl))
	return aws.ToString(out.QueueUrl), nil
}

// sqsBenchVisibility is the run queues' VisibilityTimeout in seconds. Now
// and then a ReceiveMessage answer is lost after its 200 status (the SDK
// reports "deserialization failed … use of closed network connection" and
// retries, as in aws/aws-sdk-go-v2#2737), seen 2–4 times per 20,000
// messages under CPU load, on the raw SDK loop and idemq's adapter alike:
// the messages it carried stay invisible until the timeout. At 60 s that
// stalled four of six batch runs for a minute; at 5 s a loss costs 5 s.
// Every configuration settles or extends (idemq's heartbeat) well within it.
const sqsBenchVisibility = 5

func (s *sqsBroker) declare(ctx context.Context, queue string) error {
	for _, name := range []string{queue + "-dlq", queue} {
		out, err := s.cl.CreateQueue(ctx, &awssqs.CreateQueueInput{
			QueueName:  aws.String(name),
			Attributes: map[string]string{"VisibilityTimeout": strconv.Itoa(sqsBenchVisibility)},
		})
		if err != nil {
			return fmt.Errorf("creating queue %s: %w", name, err)
		}
		s.urls.Store(name, aws.ToString(out.QueueUrl))
	}
	return nil
}

func (s *sqsBroker) remove(queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var first error
	for _, name := range []string{queue, queue + "-dlq"} {
		qu, err := s.queueURL(ctx, name)
		if err == nil {
			_, err = s.cl.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(qu)})
		}
		if err != nil && first == nil {
			first = err
		}
		s.urls.Delete(name)
	}
	return first
}

func sqsAttrs(id string) map[string]types.MessageAttributeValue {
	return map[string]types.MessageAttributeValue{
		sqsIDAttribute: {DataType: aws.String("String"), StringValue: aws.String(id)},
		headerTS:       {DataType: aws.String("String"), StringValue: aws.String(strconv.FormatInt(time.Now().UnixNano(), 10))},
	}
}

// publishBacklog sends the backlog with SendMessageBatch, 10 a call, 8
// calls at once (in order within each call; SQS standard queues do not
// keep order anyway).
func (s *sqsBroker) publishBacklog(ctx context.Context, queue string, w *workload) error {
	qu, err := s.queueURL(ctx, queue)
	if err != nil {
		return err
	}
	chunks := make(chan []int32)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for c := range chunks {
				entries := make([]types.SendMessageBatchRequestEntry, len(c))
				for i, num := range c {
					entries[i] = types.SendMessageBatchRequestEntry{
						Id:                aws.String(strconv.Itoa(i)),
						MessageBody:       aws.String(string(w.body(int(num)))),
						MessageAttributes: sqsAttrs(backlogID(int(num))),
					}
				}
				out, err := s.cl.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(qu), Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d of %d sends failed: %s", len(out.Failed), len(entries), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					errc <- fmt.Errorf("publish: %w", err)
					for range chunks { // drain, so the sender ends
					}
					return
				}
			}
		})
	}
	for i := 0; i < len(w.seq); i += sqsMaxBatch {
		chunks <- w.seq[i:min(i+sqsMaxBatch, len(w.seq))]
	}
	close(chunks)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}

func (s *sqsBroker) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	qu, err := s.queueURL(ctx, queue)
	if err != nil {
		return 0, err
	}
	return pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		_, err := s.cl.SendMessage(ctx, &awssqs.SendMessageInput{
			QueueUrl: aws.String(qu), MessageBody: aws.String(string(w.body(num))), MessageAttributes: sqsAttrs(id),
		})
		return err
	})
}

// receive is one ReceiveMessage of up to max messages, long polling for at
// most a second.
func (s *sqsBroker) receive(ctx context.Context, qu string, max int) ([]types.Message, error) {
	out, err := s.cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
		QueueUrl:              aws.String(qu),
		MaxNumberOfMessages:   int32(max),
		WaitTimeSeconds:       1,
		MessageAttributeNames: []string{sqsIDAttribute, headerTS},
	})
	if err != nil {
		return nil, err
	}
	return out.Messages, nil
}

func sqsMsg(m *types.Message) msg {
	out := msg{body: []byte(aws.ToString(m.Body))}
	if a, ok := m.MessageAttributes[sqsIDAttribute]; ok {
		out.id = aws.ToString(a.StringValue)
	}
	if a, ok := m.MessageAttributes[headerTS]; ok {
		out.ts, _ = strconv.ParseInt(aws.ToString(a.StringValue), 10, 64)
	}
	return out
}

// workers runs loop in n goroutines until ctx ends and returns the first
// error one of them returned before that.
func workers(ctx context.Context, n int, loop func() error) error {
	errc := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if err := loop(); err != nil && ctx.Err() == nil {
				errc <- err
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}

// seed is the seed-style consumer on aws-sdk-go-v2: workers loops, each
// receiving up to min(prefetch, 10) messages, then for each one store
// transaction and a DeleteMessage. A failed transaction makes the message
// visible again at once.
func (s *sqsBroker) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, n int) (*counts, error) {
	qu, err := s.queueURL(ctx, e.queue)
	if err != nil {
		return nil, err
	}
	var c counts
	err = workers(ctx, n, func() error {
		for {
			ms, err := s.receive(ctx, qu, min(prefetch, sqsMaxBatch))
			if err != nil {
				return err
			}
			for i := range ms {
				m := sqsMsg(&ms[i])
				dup, err := e.store.seedTx(ctx, e, &m)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					c.retried.Add(1)
					s.cl.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(qu), ReceiptHandle: ms[i].ReceiptHandle})
					continue
				}
				if dup {
					c.duplicates.Add(1)
				} else {
					c.processed.Add(1)
				}
				t.decided(m.id, m.ts) // at the commit, before the delete
				t.batches.Add(1)
				if _, err := s.cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(qu), ReceiptHandle: ms[i].ReceiptHandle}); err != nil {
					return fmt.Errorf("delete: %w", err)
				}
			}
		}
	})
	return &c, err
}

// sqsBatches runs n loops, each receiving up to size messages, handing
// them to do, and deleting them with one DeleteMessageBatch. A failed do
// makes the batch visible again at once.
func (s *sqsBroker) sqsBatches(ctx context.Context, e *runEnv, t *tracker, size, n int, do func([]msg) (int, error)) (*counts, error) {
	qu, err := s.queueURL(ctx, e.queue)
	if err != nil {
		return nil, err
	}
	var c counts
	err = workers(ctx, n, func() error {
		ms := make([]msg, 0, size)
		for {
			rs, err := s.receive(ctx, qu, min(size, sqsMaxBatch))
			if err != nil {
				return err
			}
			if len(rs) == 0 {
				continue
			}
			ms = ms[:0]
			for i := range rs {
				ms = append(ms, sqsMsg(&rs[i]))
			}
			won, err := do(ms)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				c.retried.Add(int64(len(ms)))
				for i := range rs {
					s.cl.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(qu), ReceiptHandle: rs[i].ReceiptHandle})
				}
				continue
			}
			c.processed.Add(int64(won))
			c.duplicates.Add(int64(len(ms) - won))
			for i := range ms {
				t.decided(ms[i].id, ms[i].ts)
			}
			t.batches.Add(1)
			entries := make([]types.DeleteMessageBatchRequestEntry, len(rs))
			for i := range rs {
				entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: rs[i].ReceiptHandle}
			}
			out, err := s.cl.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(qu), Entries: entries})
			if err == nil && len(out.Failed) > 0 {
				err = fmt.Errorf("%d of %d deletes failed: %s", len(out.Failed), len(entries), aws.ToString(out.Failed[0].Message))
			}
			if err != nil {
				return fmt.Errorf("delete batch: %w", err)
			}
		}
	})
	return &c, err
}

// handBatch is the hand-tuned batch consumer on SQS: receive up to size
// (at most 10), one store transaction (batchTx), one DeleteMessageBatch.
func (s *sqsBroker) handBatch(ctx context.Context, e *runEnv, t *tracker, size, n int) (*counts, error) {
	return s.sqsBatches(ctx, e, t, size, n, func(b []msg) (int, error) { return e.store.batchTx(ctx, e, b) })
}

// rawAck receives and deletes in batches of size, no database.
func (s *sqsBroker) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	return s.sqsBatches(ctx, e, t, size, 1, func(b []msg) (int, error) { return len(b), nil })
}
