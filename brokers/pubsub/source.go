package pubsub

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/deadletter"
)

const (
	// maxPull is the most messages a Pull returns, and the most a request
	// settles or publishes.
	maxPull = 1000
	// pullWait bounds a Pull that finds nothing.
	pullWait = 5 * time.Second
)

// Source pulls from a Pub/Sub subscription: a driver.Puller with
// driver.Extender, driver.Releaser, driver.RedeliveryHorizoner,
// driver.DeliveryLimiter and their hints. Its methods are safe for
// concurrent use.
type Source struct {
	*conn
	memo   *attempts.Memo[string] // counts deliveries without a dead-letter policy
	closed context.Context
	close  context.CancelFunc
}

// NewSource opens the subscription addr names, a pubsub:// URL as
// core.OpenSource takes it; opts (credentials, a token source, TLS) go to
// the client after the URL's. Without them the client finds Application
// Default Credentials, or PUBSUB_EMULATOR_HOST.
func NewSource(ctx context.Context, addr string, opts ...option.ClientOption) (*Source, error) {
	c, err := dial(ctx, addr, opts, true, true)
	if err != nil {
		return nil, err
	}
	s := &Source{conn: c}
	if c.sub.DeadLetterPolicy == nil {
		s.memo = attempts.New[string](1 << 16)
	}
	s.closed, s.close = context.WithCancel(context.Background())
	return s, nil
}

// Start implements driver.Source: a lease is the subscription's ack
// deadline, extended up to max_extension, and Pub/Sub waits out Retry's
// delay. A subscription with message ordering is pulled a message a
// request, up to 16 at once: Pub/Sub hands out the next message of a key
// only once the one before is acknowledged, so per-key order holds
// whatever the Consumer's concurrency.
func (s *Source) Start(_ context.Context, setup driver.Setup) (driver.Traits, error) {
	t := driver.Traits{MaxBatch: maxPull, Receivers: 2, Lease: time.Duration(s.sub.AckDeadlineSeconds) * time.Second,
		MaxExtension: s.cfg.maxExtension, DelaysRetry: true}
	if s.sub.EnableMessageOrdering {
		t.MaxBatch, t.Receivers = 1, min(setup.Window, 16)
	}
	return t, nil
}

// Receive implements driver.Puller: Pulls of up to max messages until one
// brings some. Attempt is Pub/Sub's delivery attempt where the
// subscription has a dead-letter policy, else this Source's own count.
func (s *Source) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closed, cancel)()
	for {
		rms, err := s.pull(ctx, s.sub.Name, max, pullWait)
		if s.closed.Err() != nil {
			return nil, driver.ErrSourceClosed
		} else if err != nil || len(rms) > 0 {
			return s.messages(rms, time.Now()), err
		}
	}
}

func (s *Source) messages(rms []*pb.ReceivedMessage, at time.Time) []*driver.Message {
	ms := make([]*driver.Message, len(rms))
	for i, rm := range rms {
		pm := rm.Message
		ms[i] = &driver.Message{ID: pm.Attributes[s.cfg.idAttr], Body: pm.Data, Headers: pm.Attributes, Key: pm.OrderingKey,
			Source: short(s.sub.Name), System: "gcp_pubsub", Attempt: max(1, int(rm.DeliveryAttempt)),
			Metadata: (*metadata)(rm), ReceivedAt: at, AckID: rm, BrokerKey: pm.MessageId}
		if s.memo != nil {
			ms[i].Attempt = s.memo.Last(pm.MessageId) + 1
			s.memo.Requeued(pm.MessageId, ms[i].Attempt)
		}
	}
	return ms
}

// Ack implements driver.Source: one Acknowledge per 1,000 messages.
func (s *Source) Ack(ctx context.Context, ms []*driver.Message) error {
	err := s.send(ctx, ms, -1)
	for i, e := range errsOf(err, len(ms)) {
		if s.memo != nil && e == nil {
			s.memo.Forget(ms[i].BrokerKey.(string))
		}
	}
	return err
}

// Retry implements driver.Source: the ack deadline becomes delay, rounded
// up to whole seconds (at most 600), after which Pub/Sub redelivers.
func (s *Source) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.send(ctx, ms, int32(min(600, (delay+time.Second-1)/time.Second)))
}

// Release implements driver.Releaser: an ack deadline of 0.
func (s *Source) Release(ctx context.Context, ms []*driver.Message) error { return s.send(ctx, ms, 0) }

// Extend implements driver.Extender: the ack deadline starts again.
func (s *Source) Extend(ctx context.Context, ms []*driver.Message) error {
	return s.send(ctx, ms, s.sub.AckDeadlineSeconds)
}

// DeadLetter implements driver.Source: it holds each message's ack
// deadline first (an exactly-once subscription refuses a stale delivery
// there, which is then not parked), publishes a copy with the cause to the
// dead-letter topic in one request, then acknowledges the messages; those
// whose copy was not published are handed back.
func (s *Source) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	errs := errsOf(s.send(ctx, ms, s.sub.AckDeadlineSeconds), len(ms))
	var live []*driver.Message
	var at []int
	var copies []*pb.PubsubMessage
	for i, m := range ms {
		if errs[i] != nil {
			continue
		}
		cause := deadletter.Cause(causes[i])
		if len(cause) > 1024 { // the longest attribute value Pub/Sub takes
			cause = strings.ToValidUTF8(cause[:1024], "")
		}
		attrs := map[string]string{}
		maps.Copy(attrs, m.Headers)
		maps.Copy(attrs, deadletter.Mark{Cause: cause, Attempt: m.Attempt, Origin: s.sub.Name, Destination: s.sub.Topic, At: time.Now()}.Headers())
		live, at, copies = append(live, m), append(at, i), append(copies, &pb.PubsubMessage{Data: m.Body, Attributes: attrs, OrderingKey: m.Key})
	}
	if len(live) == 0 {
		return driver.PartialOf(errs)
	}
	err := s.publish(ctx, s.cfg.dlTopic, copies)
	if err == nil {
		err = s.Ack(ctx, live)
	} else {
		err = fmt.Errorf("pubsub: parking in %s failed, the message is handed back: %w", s.cfg.dlTopic, err)
		_ = s.Release(ctx, live)
	}
	for j, e := range errsOf(err, len(live)) {
		errs[at[j]] = e
	}
	return driver.PartialOf(errs)
}

// send acknowledges ms (deadline < 0) or sets their ack deadline.
func (s *Source) send(ctx context.Context, ms []*driver.Message, deadline int32) error {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.AckID.(*pb.ReceivedMessage).AckId
	}
	return driver.PartialOf(s.settle(ctx, s.sub.Name, ids, deadline))
}

// errsOf returns the error of each of n messages of a call that returned
// err.
func errsOf(err error, n int) []error {
	if p, ok := err.(*driver.Partial); ok && len(p.Errs) == n {
		return p.Errs
	}
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: the message
// retention of the subscription, or of the dead letters' subscription when
// longer (a parked message can be redriven).
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	h := max(s.sub.GetMessageRetentionDuration().AsDuration(), s.dead.GetMessageRetentionDuration().AsDuration())
	return h, h > 0
}

// HorizonHint implements driver.HorizonHinter.
func (s *Source) HorizonHint(retention time.Duration) string {
	return fmt.Sprintf("gcloud pubsub subscriptions update %s --message-retention-duration=%ds, and the same for %s (Pub/Sub takes 600s and up)",
		short(s.sub.Name), int64(retention/time.Second), short(s.dead.Name))
}

// DeliveryLimit implements driver.DeliveryLimiter: the max delivery
// attempts of the subscription's dead-letter policy, past which Pub/Sub
// parks a message itself, without a cause.
func (s *Source) DeliveryLimit(context.Context) (int, bool) {
	n := int(s.sub.GetDeadLetterPolicy().GetMaxDeliveryAttempts())
	return n, n > 0
}

// DeliveryLimitHint implements driver.DeliveryLimitHinter.
func (s *Source) DeliveryLimitHint(maxAttempts int) string {
	return fmt.Sprintf("gcloud pubsub subscriptions update %s --max-delivery-attempts=%d (Pub/Sub takes up to 100)", short(s.sub.Name), maxAttempts)
}

// Close implements driver.Source: it ends the pulls and closes the client.
func (s *Source) Close() error {
	if s.closed.Err() != nil {
		return nil
	}
	s.close()
	return s.cl.Close()
}

// metadata is a received message's details for observers.
type metadata pb.ReceivedMessage

// All implements driver.Metadata.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		_ = yield("messaging.message.id", slog.StringValue(m.Message.MessageId)) &&
			(m.DeliveryAttempt == 0 || yield("messaging.gcp_pubsub.message.delivery_attempt", slog.Int64Value(int64(m.DeliveryAttempt)))) &&
			(m.Message.OrderingKey == "" || yield("messaging.gcp_pubsub.message.ordering_key", slog.StringValue(m.Message.OrderingKey)))
	}
}

// parked is the dead letters' subscription as deadletter.Queue reads it:
// each pulled copy is hidden for the rest of the call (up to 10 minutes a
// batch), and those not removed are given back at the end. Refs are ack
// ids.
type parked struct{ *conn }

func (d parked) Name() string { return short(d.cfg.dlTopic) }
func (d parked) Close() error { return d.cl.Close() }

func (d parked) EachBatch(ctx context.Context, fn func([]string, []*driver.Parked) error) error {
	begin := time.Now()
	var held []string
	defer func() { d.settle(context.WithoutCancel(ctx), d.dead.Name, held, 0) }()
	for {
		rms, err := d.pull(ctx, d.dead.Name, 100, 2*time.Second)
		if err != nil || len(rms) == 0 {
			return err
		}
		var refs []string
		var ps []*driver.Parked
		for _, rm := range rms {
			held = append(held, rm.AckId)
			if rm.Message.PublishTime.AsTime().Before(begin) { // parked before the call began
				refs, ps = append(refs, rm.AckId), append(ps, d.parked(rm.Message))
			}
		}
		if err := errors.Join(d.settle(ctx, d.dead.Name, held[len(held)-len(rms):], 600)...); err != nil {
			return err
		}
		if err := fn(refs, ps); err != nil {
			return err
		}
	}
}

// parked reads a parked copy: the bookkeeping attributes of idemq's, or
// those Pub/Sub adds where a dead-letter policy parked it.
func (d parked) parked(pm *pb.PubsubMessage) *driver.Parked {
	p := &driver.Parked{Ref: pm.MessageId, ID: pm.Attributes[d.cfg.idAttr], Key: pm.OrderingKey, Headers: pm.Attributes,
		Body: pm.Data, ParkedAt: pm.PublishTime.AsTime()}
	if n := pm.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"]; n != "" {
		p.Cause = "Pub/Sub's dead-letter policy: delivered " + n + " times without an acknowledgement"
		p.Origin = pm.Attributes["CloudPubSubDeadLetterSourceSubscription"]
	}
	deadletter.Read(p)
	p.Destination = or(p.Destination, d.sub.Topic)
	return p
}

func (d parked) Republish(ctx context.Context, _ string, p *driver.Parked) error {
	attrs := maps.Clone(p.Headers)
	maps.DeleteFunc(attrs, func(k, _ string) bool { return strings.HasPrefix(k, "CloudPubSubDeadLetter") })
	return d.publish(ctx, d.cfg.name("topics", p.Destination), []*pb.PubsubMessage{{Data: p.Body, Attributes: attrs, OrderingKey: p.Key}})
}

func (d parked) RemoveBatch(ctx context.Context, refs []string) []error {
	return d.settle(ctx, d.dead.Name, refs, -1)
}
