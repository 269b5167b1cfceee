// Package pubsub is idemq's Google Cloud Pub/Sub adapter: importing it
// registers pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC for sources,
// publishers and dead letters. docs/brokers.md lists the parameters.
package pubsub

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"

	gps "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2/apierror"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/urlparam"
)

const maxPull = 1000 // the most messages a Pull returns, and a request settles or publishes

func init() {
	driver.RegisterSource("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String())
	})
	driver.RegisterPublisher("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
		return NewPublisher(ctx, u.String())
	})
	driver.RegisterDeadLetters("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.DeadLetters, error) {
		return OpenDeadLetters(ctx, u.String())
	})
}

type config struct { // names are full resource names
	project, sub, topic, dlTopic, idAttr string
	declare, ordering, exactlyOnce       bool
	maxExtension                         time.Duration
	maxDeliveries                        int
}

func param[T any](p func(string, func(T) func(*config)) urlparam.Param[func(*config)], set func(*config, T)) urlparam.Param[func(*config)] {
	return p("", func(v T) func(*config) { return func(c *config) { set(c, v) } })
}

var params = urlparam.Table[func(*config)]{Scheme: "pubsub", Params: map[string]urlparam.Param[func(*config)]{
	"topic":             param(urlparam.NonEmpty, func(c *config, v string) { c.topic = v }),
	"id_attribute":      param(urlparam.NonEmpty, func(c *config, v string) { c.idAttr = v }),
	"dead_letter_topic": param(urlparam.NonEmpty, func(c *config, v string) { c.dlTopic = v }),
	"declare":           param(urlparam.Bool, func(c *config, v bool) { c.declare = v }),
	"ordering":          param(urlparam.Bool, func(c *config, v bool) { c.ordering = v }),
	"exactly_once":      param(urlparam.Bool, func(c *config, v bool) { c.exactlyOnce = v }),
	"max_extension":     param(urlparam.Duration, func(c *config, v time.Duration) { c.maxExtension = v }),
	"max_deliveries":    param(urlparam.Int, func(c *config, v int) { c.maxDeliveries = v }),
}}

func (c *config) name(kind, n string) string {
	if n == "" || strings.Contains(n, "/") {
		return n
	}
	return "projects/" + c.project + "/" + kind + "/" + n
}

type conn struct {
	cfg       config
	cl        *gps.Client
	sub, dead *pb.Subscription // dead: the dead-letter topic's
}

// dial reads a pubsub:// URL, connects, and finds (or with declare
// creates) the topics and subscriptions it names.
func dial(ctx context.Context, addr string, opts []option.ClientOption, mayDeclare bool) (*conn, error) {
	c := &conn{cfg: config{idAttr: "message-id", declare: true, maxExtension: time.Hour, maxDeliveries: 5}}
	cfg := &c.cfg
	u, err := url.Parse(addr)
	var q url.Values
	if err == nil {
		cfg.project, cfg.sub = u.Hostname(), strings.Trim(u.Path, "/")
		q, err = url.ParseQuery(u.RawQuery)
	}
	if err != nil || u.User != nil || u.Port() != "" || cfg.project == "" || cfg.sub == "" || strings.Contains(cfg.sub, "/") {
		return nil, fmt.Errorf("pubsub URL: want pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC, without credentials, a literal %% written %%25")
	}
	sets, err := params.Read(q)
	for _, set := range sets {
		set(cfg)
	}
	if err == nil && cfg.maxDeliveries != 0 && (cfg.maxDeliveries < 5 || cfg.maxDeliveries > 100) {
		err = fmt.Errorf("pubsub URL parameter max_deliveries: Pub/Sub takes 5 to 100 (0: no dead-letter policy)")
	}
	if err != nil {
		return nil, err
	}
	cfg.declare = cfg.declare && mayDeclare
	cfg.topic, cfg.sub = cfg.name("topics", cfg.topic), cfg.name("subscriptions", cfg.sub)
	if c.cl, err = gps.NewClient(ctx, cfg.project, opts...); err != nil {
		return nil, fmt.Errorf("pubsub: connecting: %w", err)
	}
	dl := cfg.name("topics", cmp.Or(cfg.dlTopic, path.Base(cfg.sub)+"-dlq"))
	want := &pb.Subscription{Name: cfg.sub, Topic: cfg.topic, EnableMessageOrdering: cfg.ordering, EnableExactlyOnceDelivery: cfg.exactlyOnce}
	if cfg.maxDeliveries > 0 {
		want.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: dl, MaxDeliveryAttempts: int32(cfg.maxDeliveries)}
	}
	if c.sub, err = c.subscription(ctx, want, dl); err == nil && cfg.topic != "" && c.sub.Topic != cfg.topic {
		err = fmt.Errorf("pubsub: subscription %s reads topic %s, not topic=%s", cfg.sub, c.sub.Topic, cfg.topic)
	}
	if err == nil { // a dead-letter policy's topic wins over dead_letter_topic
		cfg.dlTopic = cmp.Or(c.sub.GetDeadLetterPolicy().GetDeadLetterTopic(), dl)
		c.dead, err = c.subscription(ctx, &pb.Subscription{Name: cfg.name("subscriptions", path.Base(cfg.dlTopic)), Topic: cfg.dlTopic})
	}
	if err != nil {
		c.cl.Close()
		return nil, err
	}
	return c, nil
}

// subscription reads want's, created with declare after its topics.
func (c *conn) subscription(ctx context.Context, want *pb.Subscription, topics ...string) (*pb.Subscription, error) {
	get := &pb.GetSubscriptionRequest{Subscription: want.Name}
	s, err := c.cl.SubscriptionAdminClient.GetSubscription(ctx, get)
	if status.Code(err) == codes.NotFound && c.cfg.declare && want.Topic != "" {
		for _, t := range append(topics, want.Topic) { // an existing one stays; a failure shows below
			c.cl.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: t})
		}
		if _, err = c.cl.SubscriptionAdminClient.CreateSubscription(ctx, want); err == nil || status.Code(err) == codes.AlreadyExists {
			s, err = c.cl.SubscriptionAdminClient.GetSubscription(ctx, get)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pubsub: subscription %s: %w (with declare=true and topic=, a missing one is created)", want.Name, err)
	}
	return s, nil
}

func (c *conn) pull(ctx context.Context, sub string, max int, wait time.Duration) ([]*pb.ReceivedMessage, error) {
	pctx, cancel := context.WithTimeout(ctx, wait) // Pub/Sub answers an empty Pull a little before
	defer cancel()
	res, err := c.cl.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: sub, MaxMessages: int32(min(max, maxPull))})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	} else if err != nil && status.Code(err) != codes.DeadlineExceeded {
		return nil, fmt.Errorf("pubsub: pulling from %s: %w", sub, err)
	}
	return res.GetReceivedMessages(), nil
}

// settle acknowledges ids (deadline < 0) or sets their ack deadline, and
// returns each one's error: its request's, or a stale one for an ack id an
// exactly-once subscription refused (Pub/Sub redelivers the message).
func (c *conn) settle(ctx context.Context, sub string, ids []string, deadline int32) []error {
	errs := make([]error, len(ids))
	for lo := 0; lo < len(ids); lo += maxPull {
		part := ids[lo:min(lo+maxPull, len(ids))]
		var err error
		if deadline < 0 {
			err = c.cl.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: part})
		} else {
			err = c.cl.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: part, AckDeadlineSeconds: deadline})
		}
		var refused map[string]string // by ack id
		if ae, ok := apierror.FromError(err); ok && ae.Reason() == "EXACTLY_ONCE_ACKID_FAILURE" {
			refused = ae.Metadata()
		}
		for i, id := range part {
			if why, ok := refused[id]; ok {
				errs[lo+i] = driver.Stale(fmt.Errorf("pubsub: %s refused the ack id: %s", sub, why))
			} else if refused == nil && err != nil {
				errs[lo+i] = fmt.Errorf("pubsub: settling on %s: %w", sub, err)
			}
		}
	}
	return errs
}

// publish returns once Pub/Sub took msgs, a request per run of one ordering
// key (as Pub/Sub asks); a missing topic or a refused message fails it
// permanently.
func (c *conn) publish(ctx context.Context, topic string, msgs []*pb.PubsubMessage) error {
	for lo, hi := 0, 0; lo < len(msgs); lo = hi {
		for hi = lo + 1; hi < len(msgs) && hi-lo < maxPull && msgs[hi].OrderingKey == msgs[lo].OrderingKey; hi++ {
		}
		_, err := c.cl.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: msgs[lo:hi]})
		if code := status.Code(err); code == codes.NotFound || code == codes.InvalidArgument {
			return driver.Permanent(fmt.Errorf("pubsub: publishing to %s: %w", topic, err))
		} else if err != nil {
			return fmt.Errorf("pubsub: publishing to %s: %w", topic, err)
		}
	}
	return nil
}

// Source pulls from a subscription: a driver.Puller, Extender, Releaser,
// RedeliveryHorizoner and DeliveryLimiter, safe for concurrent use.
type Source struct {
	*conn
	memo   *attempts.Memo[string] // the attempts of the messages retried
	closed atomic.Bool
}

// Open opens the subscription of a pubsub:// URL; the client takes opts,
// else Application Default Credentials or PUBSUB_EMULATOR_HOST.
func Open(ctx context.Context, addr string, opts ...option.ClientOption) (*Source, error) {
	c, err := dial(ctx, addr, opts, true)
	if err != nil {
		return nil, err
	}
	return &Source{conn: c, memo: attempts.New[string](1 << 16)}, nil
}

// Start implements driver.Source: a lease is the ack deadline. An ordered
// subscription is pulled a message a request, 16 at once: Pub/Sub hands out
// a key's next message once the one before is acked, whatever the concurrency.
func (s *Source) Start(_ context.Context, setup driver.Setup) (driver.Traits, error) {
	t := driver.Traits{MaxBatch: maxPull, Receivers: 4, Lease: time.Duration(s.sub.AckDeadlineSeconds) * time.Second,
		MaxExtension: s.cfg.maxExtension, DelaysRetry: true}
	if s.sub.EnableMessageOrdering {
		t.MaxBatch, t.Receivers = 1, min(setup.Window, 16)
	}
	return t, nil
}

// Receive implements driver.Puller. Attempt is Pub/Sub's delivery attempt
// with a dead-letter policy, else one more than this Source's retries.
func (s *Source) Receive(ctx context.Context, n int) ([]*driver.Message, error) {
	var rms []*pb.ReceivedMessage
	for err := error(nil); len(rms) == 0; {
		if rms, err = s.pull(ctx, s.sub.Name, n, 5*time.Second); s.closed.Load() {
			return nil, driver.ErrSourceClosed
		} else if err != nil {
			return nil, err
		}
	}
	ms, at := make([]*driver.Message, len(rms)), time.Now()
	for i, rm := range rms {
		pm := rm.Message
		ms[i] = &driver.Message{ID: pm.Attributes[s.cfg.idAttr], Body: pm.Data, Headers: pm.Attributes, Key: pm.OrderingKey,
			Source: path.Base(s.sub.Name), System: "gcp_pubsub", Attempt: max(1, int(rm.DeliveryAttempt)),
			Metadata: metadata(pm.MessageId), ReceivedAt: at, AckID: rm, BrokerKey: pm.MessageId}
		if s.sub.DeadLetterPolicy == nil {
			ms[i].Attempt = s.memo.Last(pm.MessageId) + 1
		}
	}
	return ms, nil
}

// Ack implements driver.Source: one Acknowledge per 1,000 messages.
func (s *Source) Ack(ctx context.Context, ms []*driver.Message) error {
	return driver.PartialOf(s.send(ctx, ms, -1))
}

// Retry implements driver.Source: the ack deadline becomes delay (≤ 600s).
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	for _, m := range ms {
		s.memo.Requeued(m.BrokerKey.(string), m.Attempt) // read back only without a dead-letter policy
	}
	return driver.PartialOf(s.send(ctx, ms, int32(min(600, (delay+time.Second-1)/time.Second))))
}

// Release implements driver.Releaser: an ack deadline of 0.
func (s *Source) Release(ctx context.Context, ms []*driver.Message) error {
	return driver.PartialOf(s.send(ctx, ms, 0))
}

// Extend implements driver.Extender: the ack deadline starts again.
func (s *Source) Extend(ctx context.Context, ms []*driver.Message) error {
	return driver.PartialOf(s.send(ctx, ms, s.sub.AckDeadlineSeconds))
}

// DeadLetter implements driver.Source: it holds the ack deadlines (a stale
// delivery fails here on an exactly-once subscription), publishes copies
// with the causes to the dead-letter topic, then acks; else hands back.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	errs := s.send(ctx, ms, s.sub.AckDeadlineSeconds)
	live, copies := []*driver.Message(nil), []*pb.PubsubMessage(nil)
	for i, m := range ms {
		if errs[i] == nil {
			cause := deadletter.Cause(causes[i])
			cause = strings.ToValidUTF8(cause[:min(len(cause), 1024)], "") // the longest attribute value Pub/Sub takes
			attrs := maps.Collect(maps.All(m.Headers))
			maps.Copy(attrs, deadletter.Mark{Cause: cause, Attempt: m.Attempt, Origin: s.sub.Name, Destination: s.sub.Topic, At: time.Now()}.Headers())
			live, copies = append(live, m), append(copies, &pb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Key})
		}
	}
	acked := make([]error, len(live))
	err := s.publish(ctx, s.cfg.dlTopic, copies)
	if err == nil {
		acked = s.send(ctx, live, -1)
	} else {
		s.send(ctx, live, 0)
		err = fmt.Errorf("pubsub: parking in %s failed; the message is handed back: %w", s.cfg.dlTopic, err)
	}
	for i, j := 0, 0; i < len(ms); i++ {
		if errs[i] == nil {
			errs[i], j = cmp.Or(err, acked[j]), j+1
		}
	}
	return driver.PartialOf(errs)
}

// send acknowledges ms (deadline < 0) or sets their ack deadline.
func (s *Source) send(ctx context.Context, ms []*driver.Message, deadline int32) []error {
	ids := make([]string, len(ms))
	for i, m := range ms {
		if ids[i] = m.AckID.(*pb.ReceivedMessage).AckId; deadline < 0 {
			s.memo.Forget(m.BrokerKey.(string))
		}
	}
	return s.settle(ctx, s.sub.Name, ids, deadline)
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: the message
// retention of the subscription or, if longer, of the dead letters'.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	h := max(s.sub.GetMessageRetentionDuration().AsDuration(), s.dead.GetMessageRetentionDuration().AsDuration())
	return h, h > 0
}

// HorizonHint implements driver.HorizonHinter.
func (s *Source) HorizonHint(retention time.Duration) string {
	return fmt.Sprintf("gcloud pubsub subscriptions update %s --message-retention-duration=%ds, and %s", path.Base(s.sub.Name), int64(retention/time.Second), path.Base(s.dead.Name))
}

// DeliveryLimit implements driver.DeliveryLimiter: the dead-letter
// policy's max delivery attempts, past which Pub/Sub parks a message.
func (s *Source) DeliveryLimit(context.Context) (int, bool) {
	n := int(s.sub.GetDeadLetterPolicy().GetMaxDeliveryAttempts())
	return n, n > 0
}

// DeliveryLimitHint implements driver.DeliveryLimitHinter.
func (s *Source) DeliveryLimitHint(maxAttempts int) string {
	return fmt.Sprintf("gcloud pubsub subscriptions update %s --max-delivery-attempts=%d (Pub/Sub takes up to 100)", path.Base(s.sub.Name), maxAttempts)
}

// Close implements driver.Source: closing the client ends the pulls.
func (s *Source) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.cl.Close()
}

type metadata string // the server's message id

func (m metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) { yield("messaging.message.id", slog.StringValue(string(m))) }
}

// Publisher publishes the id, Headers and the trace context as attributes,
// Key as the ordering key. It is safe for concurrent use.
type Publisher struct{ *conn }

// NewPublisher opens a Publisher on the topic of a pubsub:// URL's
// subscription (made first with declare, so that nothing is lost).
func NewPublisher(ctx context.Context, addr string, opts ...option.ClientOption) (*Publisher, error) {
	c, err := dial(ctx, addr, opts, true)
	if err != nil {
		return nil, err
	}
	return &Publisher{c}, nil
}

// OpenDeadLetters opens the dead letters of a pubsub:// URL's subscription
// for operators; it creates nothing.
func OpenDeadLetters(ctx context.Context, addr string, opts ...option.ClientOption) (driver.DeadLetters, error) {
	c, err := dial(ctx, addr, opts, false)
	if err != nil {
		return nil, err
	}
	return deadletter.NewBatched[string](parked{c}), nil
}

// Publish implements driver.Publisher: to topic (a name, or
// projects/P/topics/T), or to the subscription's when topic is "".
func (p *Publisher) Publish(ctx context.Context, topic string, msgs ...*driver.Message) error {
	out := make([]*pb.PubsubMessage, len(msgs))
	for i, m := range msgs {
		attrs := maps.Collect(maps.All(m.Headers))
		otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(attrs))
		if m.ID != "" {
			attrs[p.cfg.idAttr] = m.ID
		}
		out[i] = &pb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Key}
	}
	return p.publish(ctx, p.cfg.name("topics", cmp.Or(topic, p.sub.Topic)), out)
}

// Close implements driver.Publisher.
func (p *Publisher) Close() error { return p.cl.Close() }

// parked is the dead letters' subscription as deadletter.Queue reads it: a
// copy pulled is hidden (up to 10 minutes) until the call ends.
type parked struct{ *conn }

func (d parked) Name() string { return path.Base(d.cfg.dlTopic) }
func (d parked) Close() error { return d.cl.Close() }

func (d parked) EachBatch(ctx context.Context, fn func([]string, []*driver.Parked) error) error {
	begin, held := time.Now(), []string(nil)
	defer func() { d.settle(context.WithoutCancel(ctx), d.dead.Name, held, 0) }()
	for {
		rms, err := d.pull(ctx, d.dead.Name, 100, 2*time.Second)
		if err != nil || len(rms) == 0 {
			return err
		}
		refs, ps := []string(nil), []*driver.Parked(nil)
		for _, rm := range rms {
			held = append(held, rm.AckId)
			if pm := rm.Message; pm.PublishTime.AsTime().Before(begin) { // parked before the call began
				p := &driver.Parked{Ref: pm.MessageId, ID: pm.Attributes[d.cfg.idAttr], Key: pm.OrderingKey, Headers: pm.Attributes,
					Body: pm.Data, ParkedAt: pm.PublishTime.AsTime(), Origin: pm.Attributes["CloudPubSubDeadLetterSourceSubscription"]}
				if n := pm.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"]; n != "" { // parked by a dead-letter policy
					p.Cause = "Pub/Sub's dead-letter policy: delivered " + n + " times without an acknowledgement"
				}
				deadletter.Read(p)
				p.Destination = cmp.Or(p.Destination, d.sub.Topic)
				refs, ps = append(refs, rm.AckId), append(ps, p)
			}
		}
		if err := cmp.Or(d.settle(ctx, d.dead.Name, held[len(held)-len(rms):], 600)...); err != nil {
			return err
		} else if err := fn(refs, ps); err != nil {
			return err
		}
	}
}

func (d parked) Republish(ctx context.Context, _ string, p *driver.Parked) error {
	attrs := maps.Clone(p.Headers)
	maps.DeleteFunc(attrs, func(k, _ string) bool { return strings.HasPrefix(k, "CloudPubSubDeadLetter") })
	return d.publish(ctx, d.cfg.name("topics", p.Destination), []*pb.PubsubMessage{{Data: p.Body, Attributes: attrs, OrderingKey: p.Key}})
}

func (d parked) RemoveBatch(ctx context.Context, refs []string) []error {
	return d.settle(ctx, d.dead.Name, refs, -1)
}
