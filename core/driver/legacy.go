package driver

import (
	"context"
	"log/slog"
	"net/url"
	"time"
)

// OldSource is the per-delivery source contract, kept only while adapters
// move to Source; core/driver/legacy adapts one to a Puller.
type OldSource interface {
	Receive(ctx context.Context) (Delivery, error)
	Close() error
}

// Delivery is one received message and the ways to settle it. The Consumer
// calls exactly one settlement method, once, and only after the message's
// decision is final (for Processed: after the commit).
type Delivery interface {
	// Message returns the received message. The pipeline may set its ID
	// (through an IDFunc) but does not otherwise change it.
	Message() *Message
	// Ack tells the broker the message is done (Processed or Duplicate).
	Ack(ctx context.Context) error
	// Retry asks the broker to deliver the message again, no sooner than
	// delay from now where the broker can express a delay.
	Retry(ctx context.Context, delay time.Duration) error
	// DeadLetter parks the message with its cause, never silently dropping
	// it.
	DeadLetter(ctx context.Context, cause error) error
}

// IDErrorer is implemented by deliveries whose adapter found the id where
// it reads it but could not use it (a header of the wrong type, say). The
// message then has no ID; the Consumer dead-letters it with ErrMissingID
// and this error as the cause, so the operator reads why.
type IDErrorer interface {
	IDError() error
}

// BatchSettler is implemented by sources that can acknowledge several
// deliveries in one call (AMQP multiple ack, SQS DeleteMessageBatch). The
// Consumer uses it for the Acks of one batch; deliveries it is given came
// from this source.
type BatchSettler interface {
	AckBatch(ctx context.Context, ds []Delivery) error
}

// WindowSetter is implemented by sources that keep their own prefetch
// window (AMQP QoS, SQS receivers): the Consumer tells them its in-flight
// window before the first Receive, so the broker never hands over more than
// the Consumer will hold.
type WindowSetter interface {
	SetWindow(n int) error
}

// LoggerSetter is implemented by sources that log (reconnects, receive
// errors, settlements that failed). The Consumer gives them its own logger
// before the first Receive, so the service's logger (its level, handler and
// attributes) reaches adapter warnings too. A source that was given a logger
// of its own (an adapter option, or OpenConfig.Logger) keeps it and ignores
// SetLogger.
type LoggerSetter interface {
	SetLogger(l *slog.Logger)
}

// OldSourceOpener opens an OldSource.
type OldSourceOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (OldSource, error)

// RegisterBroker registers an adapter still on the per-delivery contract:
// its sources are adapted with Adapt.
func RegisterBroker(scheme string, src OldSourceOpener, pub PublisherOpener) {
	if src == nil || pub == nil {
		panic("idemq: RegisterBroker " + scheme + ": nil opener")
	}
	RegisterSource(scheme, func(ctx context.Context, u *url.URL, cfg OpenConfig) (Source, error) {
		s, err := src(ctx, u, cfg)
		if err != nil {
			return nil, err
		}
		return Adapt(s), nil
	})
	RegisterPublisher(scheme, pub)
}

// Adapt runs an OldSource as a Puller: one delivery per Receive, settled
// through the delivery's own methods.
func Adapt(s OldSource) Puller { return &adapted{s: s} }

type adapted struct{ s OldSource }

// Unwrap returns the adapted source.
func (a *adapted) Unwrap() OldSource { return a.s }

func (a *adapted) Start(ctx context.Context, st Setup) (Traits, error) {
	if ls, ok := a.s.(LoggerSetter); ok {
		ls.SetLogger(st.Logger)
	}
	if ws, ok := a.s.(WindowSetter); ok {
		if err := ws.SetWindow(st.Window); err != nil {
			return Traits{}, err
		}
	}
	return Traits{MaxBatch: 1, DelaysRetry: true}, nil
}

func (a *adapted) Receive(ctx context.Context, _ int) ([]*Message, error) {
	d, err := a.s.Receive(ctx)
	if err != nil {
		return nil, err
	}
	m := *d.Message()
	m.AckID = d
	if ie, ok := d.(IDErrorer); ok && m.ID == "" {
		m.IDError = ie.IDError()
	}
	return []*Message{&m}, nil
}

// syncID copies what the pipeline set (an IDFunc's id) back to the delivery.
func syncID(m *Message) Delivery {
	d := m.AckID.(Delivery)
	d.Message().ID = m.ID
	return d
}

func (a *adapted) Ack(ctx context.Context, ms []*Message) error {
	ds := make([]Delivery, len(ms))
	for i, m := range ms {
		ds[i] = syncID(m)
	}
	if bs, ok := a.s.(BatchSettler); ok && len(ds) > 1 {
		return bs.AckBatch(ctx, ds)
	}
	errs := make([]error, len(ds))
	for i, d := range ds {
		errs[i] = d.Ack(ctx)
	}
	return PartialOf(errs)
}

func (a *adapted) Retry(ctx context.Context, ms []*Message, delay time.Duration) error {
	errs := make([]error, len(ms))
	for i, m := range ms {
		errs[i] = syncID(m).Retry(ctx, delay)
	}
	return PartialOf(errs)
}

func (a *adapted) DeadLetter(ctx context.Context, ms []*Message, causes []error) error {
	errs := make([]error, len(ms))
	for i, m := range ms {
		errs[i] = syncID(m).DeadLetter(ctx, causes[i])
	}
	return PartialOf(errs)
}

func (a *adapted) Close() error { return a.s.Close() }

func (a *adapted) RedeliveryHorizon(ctx context.Context) (time.Duration, bool) {
	if h, ok := a.s.(RedeliveryHorizoner); ok {
		return h.RedeliveryHorizon(ctx)
	}
	return 0, false
}

func (a *adapted) HorizonHint(retention time.Duration) string {
	if h, ok := a.s.(HorizonHinter); ok {
		return h.HorizonHint(retention)
	}
	return ""
}

func (a *adapted) DeliveryLimit(ctx context.Context) (int, bool) {
	if h, ok := a.s.(DeliveryLimiter); ok {
		return h.DeliveryLimit(ctx)
	}
	return 0, false
}

func (a *adapted) DeliveryLimitHint(maxAttempts int) string {
	if h, ok := a.s.(DeliveryLimitHinter); ok {
		return h.DeliveryLimitHint(maxAttempts)
	}
	return ""
}
