package benchmark

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	gps "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	_ "github.com/idemq/idemq/brokers/pubsub" // the pubsub:// scheme of core.OpenSource
)

// pubsubMaxBatch is the most messages one Pull returns and one request
// publishes or acknowledges.
const pubsubMaxBatch = 1000

// pubsubIDAttribute is the message attribute idemq's Pub/Sub adapter reads
// the business id from by default.
const pubsubIDAttribute = "message-id"

// pubsubAckDeadline is the run subscriptions' ack deadline. The raw
// consumers never extend one, so it is long enough for any batch; idemq
// takes it as its lease and extends what it holds past a third of it.
const pubsubAckDeadline = 60

// pubsubBroker is the Pub/Sub side of a run: the client's low-level
// SubscriberClient and PublisherClient (Pull, Acknowledge,
// ModifyAckDeadline, Publish), on which both the raw consumers and idemq's
// adapter run. Every run creates its own topic and subscription (and the
// dead-letter topic and subscription idemq parks in, QUEUE-dlq) and
// deletes them afterwards. The client reaches the emulator through
// PUBSUB_EMULATOR_HOST.
type pubsubBroker struct {
	idemqURL *url.URL
	project  string
	base     string
	cl       *gps.Client
}

func newPubSub(ctx context.Context, u *url.URL) (*pubsubBroker, error) {
	p := &pubsubBroker{idemqURL: u, project: u.Host, base: strings.Trim(u.Path, "/")}
	if p.project == "" || p.base == "" || strings.Contains(p.base, "/") {
		return nil, errors.New("benchmark: Config.Broker: want pubsub://PROJECT/SUBSCRIPTION")
	}
	for _, k := range []string{"topic", "dead_letter_topic", "declare", "max_deliveries", "ordering", "exactly_once"} {
		if u.Query().Has(k) {
			return nil, fmt.Errorf("benchmark: Config.Broker: parameter %s is set per run (each run has its own topic and subscription)", k)
		}
	}
	cl, err := gps.NewClient(ctx, p.project)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Broker: %v", err)
	}
	p.cl = cl
	return p, nil
}

func (p *pubsubBroker) kind() string      { return "Pub/Sub" }
func (p *pubsubBroker) baseQueue() string { return p.base }
func (p *pubsubBroker) close()            { p.cl.Close() }

func (p *pubsubBroker) name(kind, n string) string {
	return "projects/" + p.project + "/" + kind + "/" + n
}

func (p *pubsubBroker) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := p.cl.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: p.name("topics", "idemq-bench-ping")})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}

func (p *pubsubBroker) version(context.Context) string {
	if h := os.Getenv("PUBSUB_EMULATOR_HOST"); h != "" {
		return "Pub/Sub emulator at " + h + " (cloud.google.com/go/pubsub/v2 low-level client)"
	}
	return "Google Cloud Pub/Sub (cloud.google.com/go/pubsub/v2 low-level client)"
}

func (p *pubsubBroker) describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw client): pull up to 5, then per message 1 tx + Acknowledge; 1 worker"
	case SeedP100W8:
		return "seed pattern (raw client): pull up to 100, then per message 1 tx + Acknowledge; 8 workers"
	case HandBatch:
		return "hand-tuned batch (raw client): pull up to the batch, 1 claim + 1 set-based UPDATE + 1 commit + 1 Acknowledge"
	case RawAck:
		return "broker only: pull up to the batch + 1 Acknowledge, no database"
	}
	return ""
}

// sourceURL is Config.Broker with its subscription replaced by queue, on
// the run's topic, creating nothing (declare did).
func (p *pubsubBroker) sourceURL(queue, _ string) string {
	u := *p.idemqURL
	u.Path = "/" + queue
	q := u.Query()
	q.Set("topic", queue)
	q.Set("declare", "false")
	u.RawQuery = q.Encode()
	return u.String()
}

// declare creates the run's topic and subscription (no dead-letter policy,
// so the raw consumers and idemq see the same subscription), and the
// dead-letter topic and subscription idemq parks in.
func (p *pubsubBroker) declare(ctx context.Context, queue string) error {
	for _, name := range []string{queue + "-dlq", queue} {
		if _, err := p.cl.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: p.name("topics", name)}); err != nil {
			return fmt.Errorf("creating topic %s: %w", name, err)
		}
		if _, err := p.cl.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
			Name: p.name("subscriptions", name), Topic: p.name("topics", name), AckDeadlineSeconds: pubsubAckDeadline,
		}); err != nil {
			return fmt.Errorf("creating subscription %s: %w", name, err)
		}
	}
	return nil
}

func (p *pubsubBroker) remove(queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, name := range []string{queue, queue + "-dlq"} {
		errs = append(errs, p.cl.SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: p.name("subscriptions", name)}),
			p.cl.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: p.name("topics", name)}))
	}
	return errors.Join(errs...)
}

func pubsubMessage(w *workload, id string, num int) *pb.PubsubMessage {
	return &pb.PubsubMessage{Data: w.body(num), Attributes: map[string]string{
		pubsubIDAttribute: id, headerTS: strconv.FormatInt(time.Now().UnixNano(), 10),
	}}
}

// publishBacklog publishes the backlog 1,000 messages a request, 8
// requests at once (in order within each request).
func (p *pubsubBroker) publishBacklog(ctx context.Context, queue string, w *workload) error {
	topic := p.name("topics", queue)
	chunks := make(chan []int32)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for c := range chunks {
				ms := make([]*pb.PubsubMessage, len(c))
				for i, num := range c {
					ms[i] = pubsubMessage(w, backlogID(int(num)), int(num))
				}
				if _, err := p.cl.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: ms}); err != nil {
					errc <- fmt.Errorf("publish: %w", err)
					for range chunks { // drain, so the sender ends
					}
					return
				}
			}
		})
	}
	for i := 0; i < len(w.seq); i += pubsubMaxBatch {
		chunks <- w.seq[i:min(i+pubsubMaxBatch, len(w.seq))]
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

func (p *pubsubBroker) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	topic := p.name("topics", queue)
	return pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		_, err := p.cl.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: []*pb.PubsubMessage{pubsubMessage(w, id, num)}})
		return err
	})
}

// pull is one Pull of up to max messages, waiting at most a second when
// there are none.
func (p *pubsubBroker) pull(ctx context.Context, sub string, max int) ([]*pb.ReceivedMessage, error) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := p.cl.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: sub, MaxMessages: int32(max)})
	if err != nil && (ctx.Err() != nil || status.Code(err) != codes.DeadlineExceeded) {
		return nil, err
	}
	return res.GetReceivedMessages(), nil
}

func pubsubMsg(rm *pb.ReceivedMessage) msg {
	out := msg{id: rm.Message.Attributes[pubsubIDAttribute], body: rm.Message.Data}
	out.ts, _ = strconv.ParseInt(rm.Message.Attributes[headerTS], 10, 64)
	return out
}

// settle acknowledges rms (deadline < 0) or sets their ack deadline, in
// one request.
func (p *pubsubBroker) settle(ctx context.Context, sub string, rms []*pb.ReceivedMessage, deadline int32) error {
	ids := make([]string, len(rms))
	for i, rm := range rms {
		ids[i] = rm.AckId
	}
	if deadline < 0 {
		return p.cl.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: ids})
	}
	return p.cl.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: ids, AckDeadlineSeconds: deadline})
}

// seed is the seed-style consumer on the raw client: workers loops, each
// pulling up to prefetch messages, then for each one store transaction
// and an Acknowledge of its own. A failed transaction hands the message
// back at once (ack deadline 0).
func (p *pubsubBroker) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, n int) (*counts, error) {
	sub := p.name("subscriptions", e.queue)
	var c counts
	err := workers(ctx, n, func() error {
		for {
			rms, err := p.pull(ctx, sub, prefetch)
			if err != nil {
				return err
			}
			for _, rm := range rms {
				m := pubsubMsg(rm)
				dup, err := e.store.seedTx(ctx, e, &m)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					c.retried.Add(1)
					p.settle(ctx, sub, []*pb.ReceivedMessage{rm}, 0)
					continue
				}
				if dup {
					c.duplicates.Add(1)
				} else {
					c.processed.Add(1)
				}
				t.decided(m.id, m.ts) // at the commit, before the ack
				t.batches.Add(1)
				if err := p.settle(ctx, sub, []*pb.ReceivedMessage{rm}, -1); err != nil {
					return fmt.Errorf("acknowledge: %w", err)
				}
			}
		}
	})
	return &c, err
}

// stream keeps up to 4 × size pulled messages buffered (idemq's default
// window, as the RabbitMQ baselines' prefetch), pulling up to size a
// request, until ctx ends; the error channel gets a failed Pull's error.
func (p *pubsubBroker) stream(ctx context.Context, sub string, size int) (<-chan *pb.ReceivedMessage, <-chan error) {
	out, errc := make(chan *pb.ReceivedMessage, 4*size), make(chan error, 1)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			rms, err := p.pull(ctx, sub, max(1, min(size, cap(out)-len(out))))
			if err != nil {
				if ctx.Err() == nil {
					errc <- err
				}
				return
			}
			for _, rm := range rms {
				select {
				case out <- rm:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, errc
}

// batches runs n loops, each taking batches of up to size from a stream
// of its own (see stream), handing them to do, and acknowledging each
// batch in one request. A failed do hands the batch back at once.
func (p *pubsubBroker) batches(ctx context.Context, e *runEnv, t *tracker, size, n int, do func([]msg) (int, error)) (*counts, error) {
	sub := p.name("subscriptions", e.queue)
	var c counts
	err := workers(ctx, n, func() error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		rmc, pullErr := p.stream(ctx, sub, size)
		buf := make([]*pb.ReceivedMessage, 0, size)
		ms := make([]msg, 0, size)
		for {
			rms, err := nextMsgs(ctx, rmc, buf, size)
			if err != nil {
				select {
				case err = <-pullErr:
					return err
				default:
					return nil
				}
			}
			ms = ms[:0]
			for _, rm := range rms {
				ms = append(ms, pubsubMsg(rm))
			}
			won, err := do(ms)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				c.retried.Add(int64(len(ms)))
				p.settle(ctx, sub, rms, 0)
				continue
			}
			c.processed.Add(int64(won))
			c.duplicates.Add(int64(len(ms) - won))
			for i := range ms {
				t.decided(ms[i].id, ms[i].ts)
			}
			t.batches.Add(1)
			if err := p.settle(ctx, sub, rms, -1); err != nil {
				return fmt.Errorf("acknowledge: %w", err)
			}
		}
	})
	return &c, err
}

// handBatch is the hand-tuned batch consumer on Pub/Sub: pull up to size,
// one store transaction (batchTx), one Acknowledge.
func (p *pubsubBroker) handBatch(ctx context.Context, e *runEnv, t *tracker, size, n int) (*counts, error) {
	return p.batches(ctx, e, t, size, n, func(b []msg) (int, error) { return e.store.batchTx(ctx, e, b) })
}

// rawAck pulls and acknowledges in batches of size, no database.
func (p *pubsubBroker) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	return p.batches(ctx, e, t, size, 1, func(b []msg) (int, error) { return len(b), nil })
}
