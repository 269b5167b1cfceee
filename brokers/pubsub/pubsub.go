// Package pubsub is idemq's Google Cloud Pub/Sub adapter, written on the
// public contract alone (core/driver and its kits):
// pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC opens a Source pulling from the
// subscription, a Publisher on its topic and, for operators, its dead
// letters. Importing the package registers the scheme. The business id is
// a message attribute, never Pub/Sub's messageId, which a producer's retry
// changes. docs/brokers.md lists the parameters.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strings"
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
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/urlparam"
)

func init() {
	driver.RegisterSource("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Source, error) {
		return NewSource(ctx, u.String())
	})
	driver.RegisterPublisher("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
		return NewPublisher(ctx, u.String())
	})
	driver.RegisterDeadLetters("pubsub", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.DeadLetters, error) {
		c, err := dial(ctx, u.String(), nil, true, false) // an operator's tool creates nothing
		return deadletter.NewBatched[string](parked{c}), err
	})
}

// config is what a pubsub:// URL says; names are full resource names.
type config struct {
	project, sub, topic, dlTopic   string
	idAttr, endpoint               string
	declare, ordering, exactlyOnce bool
	ackDeadline, maxExtension      time.Duration
	maxDeliveries                  int
}

// param is a URL parameter setting a field of config.
func param[T any](p func(string, func(T) func(*config)) urlparam.Param[func(*config)], set func(*config, T)) urlparam.Param[func(*config)] {
	return p("", func(v T) func(*config) { return func(c *config) { set(c, v) } })
}

var params = urlparam.Table[func(*config)]{Scheme: "pubsub", Params: map[string]urlparam.Param[func(*config)]{
	"topic":             param(urlparam.NonEmpty, func(c *config, v string) { c.topic = v }),
	"id_attribute":      param(urlparam.NonEmpty, func(c *config, v string) { c.idAttr = v }),
	"dead_letter_topic": param(urlparam.NonEmpty, func(c *config, v string) { c.dlTopic = v }),
	"endpoint":          param(urlparam.NonEmpty, func(c *config, v string) { c.endpoint = v }),
	"declare":           param(urlparam.Bool, func(c *config, v bool) { c.declare = v }),
	"ordering":          param(urlparam.Bool, func(c *config, v bool) { c.ordering = v }),
	"exactly_once":      param(urlparam.Bool, func(c *config, v bool) { c.exactlyOnce = v }),
	"ack_deadline":      param(urlparam.Duration, func(c *config, v time.Duration) { c.ackDeadline = v }),
	"max_extension":     param(urlparam.Duration, func(c *config, v time.Duration) { c.maxExtension = v }),
	"max_deliveries":    param(urlparam.Int, func(c *config, v int) { c.maxDeliveries = v }),
}}

// parse reads pubsub://PROJECT[/SUBSCRIPTION]?topic=… into a config.
func parse(addr string) (c config, err error) {
	c = config{idAttr: "message-id", declare: true, ackDeadline: 10 * time.Second, maxExtension: time.Hour, maxDeliveries: 5}
	u, err := url.Parse(addr)
	if err != nil || u.User != nil || u.Port() != "" || u.Hostname() == "" || strings.Contains(strings.Trim(u.Path, "/"), "/") {
		return c, errors.New("pubsub URL: want pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC (credentials never go in it)")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return c, errors.New("pubsub URL: malformed query (a literal % is written %25)")
	}
	sets, err := params.Read(q)
	for _, set := range sets {
		set(&c)
	}
	switch {
	case err != nil:
	case c.ackDeadline < 10*time.Second || c.ackDeadline > 600*time.Second:
		err = errors.New("pubsub URL parameter ack_deadline: Pub/Sub takes 10s to 600s")
	case c.maxDeliveries != 0 && (c.maxDeliveries < 5 || c.maxDeliveries > 100):
		err = errors.New("pubsub URL parameter max_deliveries: Pub/Sub takes 5 to 100 (0: no dead-letter policy)")
	}
	c.project = u.Hostname()
	c.topic, c.sub = c.name("topics", c.topic), c.name("subscriptions", strings.Trim(u.Path, "/"))
	return c, err
}

// name returns the full resource name of a short one (a full one as it is).
func (c *config) name(kind, n string) string {
	if n == "" || strings.Contains(n, "/") {
		return n
	}
	return "projects/" + c.project + "/" + kind + "/" + n
}

// short returns the last element of a resource name.
func short(name string) string { return name[strings.LastIndex(name, "/")+1:] }

// or returns v, or def when v is "".
func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// conn is a client and the resources a URL names, found or created.
type conn struct {
	cfg  config
	cl   *gps.Client
	sub  *pb.Subscription // nil for a Publisher of a topic alone
	dead *pb.Subscription // the dead-letter topic's subscription
}

// dial connects (to endpoint= when given, then with opts)
// and finds, or with declare creates, the topic, the subscription and the
// dead-letter topic and subscription addr names.
func dial(ctx context.Context, addr string, opts []option.ClientOption, needSub, mayDeclare bool) (*conn, error) {
	cfg, err := parse(addr)
	if err != nil {
		return nil, err
	}
	cfg.declare = cfg.declare && mayDeclare
	if (needSub && cfg.sub == "") || (cfg.sub == "" && cfg.topic == "") {
		return nil, errors.New("pubsub URL: want pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC, or pubsub://PROJECT?topic=TOPIC to publish")
	}
	if cfg.endpoint != "" {
		opts = append([]option.ClientOption{option.WithEndpoint(cfg.endpoint)}, opts...)
	}
	c := &conn{cfg: cfg}
	if c.cl, err = gps.NewClient(ctx, cfg.project, opts...); err != nil {
		return nil, fmt.Errorf("pubsub: connecting: %w", err)
	}
	if err = c.find(ctx); err != nil {
		c.cl.Close()
		return nil, err
	}
	return c, nil
}

func (c *conn) find(ctx context.Context) (err error) {
	cfg := &c.cfg
	if cfg.sub == "" {
		return c.topic(ctx, cfg.topic)
	}
	switch c.sub, err = c.cl.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: cfg.sub}); {
	case status.Code(err) == codes.NotFound && cfg.declare && cfg.topic != "": // made below, after its dead letters' subscription
	case err != nil:
		return missing(err, "subscription", cfg.sub)
	case cfg.topic != "" && c.sub.Topic != cfg.topic:
		return fmt.Errorf("pubsub: subscription %s reads topic %s, not topic=%s", cfg.sub, c.sub.Topic, cfg.topic)
	}
	// A dead-letter policy's topic wins over dead_letter_topic. Its
	// subscription comes first: a topic keeps nothing for a subscription
	// made after the publish.
	cfg.dlTopic = or(c.sub.GetDeadLetterPolicy().GetDeadLetterTopic(), cfg.name("topics", or(cfg.dlTopic, short(cfg.sub)+"-dlq")))
	if c.dead, err = c.subscription(ctx, &pb.Subscription{Name: cfg.name("subscriptions", short(cfg.dlTopic)), Topic: cfg.dlTopic}); err != nil || c.sub != nil {
		return err
	}
	want := &pb.Subscription{Name: cfg.sub, Topic: cfg.topic, AckDeadlineSeconds: int32(cfg.ackDeadline / time.Second),
		EnableMessageOrdering: cfg.ordering, EnableExactlyOnceDelivery: cfg.exactlyOnce}
	if cfg.maxDeliveries > 0 {
		want.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: cfg.dlTopic, MaxDeliveryAttempts: int32(cfg.maxDeliveries)}
	}
	c.sub, err = c.subscription(ctx, want)
	return err
}

// topic checks that name exists, creating it with declare.
func (c *conn) topic(ctx context.Context, name string) error {
	_, err := c.cl.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: name})
	if status.Code(err) == codes.NotFound && c.cfg.declare {
		if _, err = c.cl.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: name}); status.Code(err) == codes.AlreadyExists {
			err = nil
		}
	}
	return missing(err, "topic", name)
}

// subscription returns want's subscription, creating it (and its topic)
// with declare.
func (c *conn) subscription(ctx context.Context, want *pb.Subscription) (*pb.Subscription, error) {
	get := &pb.GetSubscriptionRequest{Subscription: want.Name}
	s, err := c.cl.SubscriptionAdminClient.GetSubscription(ctx, get)
	if status.Code(err) == codes.NotFound && c.cfg.declare {
		if err = c.topic(ctx, want.Topic); err == nil {
			if s, err = c.cl.SubscriptionAdminClient.CreateSubscription(ctx, want); status.Code(err) == codes.AlreadyExists {
				s, err = c.cl.SubscriptionAdminClient.GetSubscription(ctx, get)
			}
		}
	}
	return s, missing(err, "subscription", want.Name)
}

// missing words err of the resource kind name.
func missing(err error, kind, name string) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("pubsub: %s %s does not exist (with declare=true and topic=, it is created)", kind, name)
	} else if err != nil {
		return fmt.Errorf("pubsub: %s %s: %w", kind, name, err)
	}
	return nil
}

// pull is one Pull of up to max messages from sub, waiting at most wait
// (Pub/Sub answers an empty one a little before).
func (c *conn) pull(ctx context.Context, sub string, max int, wait time.Duration) ([]*pb.ReceivedMessage, error) {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	res, err := c.cl.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: sub, MaxMessages: int32(min(max, maxPull))})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	} else if err != nil && status.Code(err) != codes.DeadlineExceeded {
		return nil, fmt.Errorf("pubsub: pulling from %s: %w", sub, err)
	}
	return res.GetReceivedMessages(), nil
}

// settle acknowledges ids on sub (deadline < 0) or sets their ack
// deadline, 1,000 a request, and returns each one's error: its request's,
// or what an exactly-once subscription refused by ack id (stale where it
// no longer knows the id: Pub/Sub redelivers the message).
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
		ae, _ := apierror.FromError(err)
		for i, id := range part {
			if ae == nil || ae.Reason() != "EXACTLY_ONCE_ACKID_FAILURE" {
				errs[lo+i] = err
			} else if why, refused := ae.Metadata()[id]; refused {
				errs[lo+i] = fmt.Errorf("the ack id was refused: %s", why)
				if strings.HasPrefix(why, "PERMANENT_FAILURE_INVALID_ACK_ID") {
					errs[lo+i] = driver.Stale(errs[lo+i])
				}
			}
			if errs[lo+i] != nil {
				errs[lo+i] = fmt.Errorf("pubsub: settling on %s: %w", sub, errs[lo+i])
			}
		}
	}
	return errs
}

// publish sends msgs to topic, 1,000 a request, and returns once Pub/Sub
// took them all; a topic that does not exist, or a message Pub/Sub
// refuses, fails it permanently.
func (c *conn) publish(ctx context.Context, topic string, msgs []*pb.PubsubMessage) error {
	for lo := 0; lo < len(msgs); lo += maxPull {
		_, err := c.cl.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: msgs[lo:min(lo+maxPull, len(msgs))]})
		if code := status.Code(err); code == codes.NotFound || code == codes.InvalidArgument {
			return driver.Permanent(fmt.Errorf("pubsub: publishing to %s: %w", topic, err))
		} else if err != nil {
			return fmt.Errorf("pubsub: publishing to %s: %w", topic, err)
		}
	}
	return nil
}

// Publisher publishes to a topic: the business id in the id attribute,
// Headers as attributes with the caller's trace context (the global
// OpenTelemetry propagator), Key as the ordering key. It is safe for
// concurrent use.
type Publisher struct{ *conn }

// NewPublisher opens a Publisher on the topic addr names:
// pubsub://PROJECT?topic=TOPIC, or a subscription's URL (its topic; with
// declare the subscription and its dead letters' are made first, so that
// nothing published is lost). opts go to the client after the URL's.
func NewPublisher(ctx context.Context, addr string, opts ...option.ClientOption) (*Publisher, error) {
	c, err := dial(ctx, addr, opts, false, true)
	if err != nil {
		return nil, err
	}
	c.cfg.topic = or(c.cfg.topic, c.sub.GetTopic())
	return &Publisher{c}, nil
}

// Publish implements driver.Publisher: to topic (a name, or
// projects/P/topics/T), or to the Publisher's own when topic is "". A
// topic that does not exist, or a message Pub/Sub refuses, fails the call
// permanently (driver.Permanent).
func (p *Publisher) Publish(ctx context.Context, topic string, msgs ...*driver.Message) error {
	out := make([]*pb.PubsubMessage, len(msgs))
	for i, m := range msgs {
		attrs := make(map[string]string, len(m.Headers)+3)
		maps.Copy(attrs, m.Headers)
		otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(attrs))
		if m.ID != "" {
			attrs[p.cfg.idAttr] = m.ID
		}
		out[i] = &pb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Key}
	}
	return p.publish(ctx, p.cfg.name("topics", or(topic, p.cfg.topic)), out)
}

// Close implements driver.Publisher.
func (p *Publisher) Close() error { return p.cl.Close() }
