package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
)

// System is the Message.System of every message a Source receives.
const System = "webhook"

// maxRemembered bounds the events whose attempt count a Source keeps.
const maxRemembered = 10000

// Source is an HTTP endpoint as a broker: an http.Handler a service mounts
// in its own server (or that Open serves), and a driver.Source whose
// deliveries are the verified requests, each answered when the Consumer
// settles it. It implements driver's Source, WindowSetter and
// LoggerSetter. Receive may be called from several goroutines.
type Source struct {
	c        config
	log      unsettled.Logger
	queue    chan *delivery // unbuffered: a request is handed out or not
	done     chan struct{}  // closed by Close
	room     unsettled.Room
	attempts *unsettled.Attempts[string]
	handed   atomic.Int64 // handed out, not settled
	slots    atomic.Int64 // of the window: handed out, or reserved by a Receive waiting for a request
	copies   atomic.Int64 // requests waiting for an earlier copy's answer

	mu      sync.Mutex
	flights map[string]*flight // by event id: the copy handed out or queued
	window  int
	closed  bool

	// Set when Open serves the Source itself.
	srv    *http.Server
	ln     net.Listener
	served chan struct{}
	fresh  map[net.Conn]struct{} // connections that have not sent a request yet; under mu
}

// track keeps the served connections that have not sent a request yet:
// http.Server.Shutdown takes such a connection for idle only once it is
// 5 s old, so a client's spare connection would hold Close up to its
// deadline.
func (s *Source) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case http.StateNew:
		if s.fresh == nil {
			s.fresh = map[net.Conn]struct{}{}
		}
		s.fresh[c] = struct{}{}
	default:
		delete(s.fresh, c)
	}
}

// NewSource returns a Source configured by opts; WithProfile and
// WithParkDir are required.
func NewSource(opts ...Option) (*Source, error) {
	c, err := resolve(nil, opts, func(err error) error { return err })
	if err != nil {
		return nil, err
	}
	return newSource(c), nil
}

func newSource(c config) *Source {
	s := &Source{c: c, queue: make(chan *delivery), done: make(chan struct{}), room: unsettled.NewRoom(),
		attempts: unsettled.NewAttempts[string](maxRemembered), flights: map[string]*flight{}}
	s.log.Init(c.logger)
	return s
}

// SetLogger implements driver.LoggerSetter.
func (s *Source) SetLogger(l *slog.Logger) { s.log.SetLogger(l) }

// SetWindow implements driver.WindowSetter: Receive hands out no more than
// n requests unsettled.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("webhook: window %d must be positive", n)
	}
	s.mu.Lock()
	s.window = n
	s.mu.Unlock()
	return nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: WithHorizon, else
// the profile's automatic retry window; unknown for a profile of another
// name.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	if s.c.horizon > 0 {
		return s.c.horizon, true
	}
	d, ok := defaultHorizons[s.c.profile.Name()]
	return d, ok
}

// HorizonHint implements driver.HorizonHinter: the provider's retry window
// is not the service's to change, so the store keeps claims longer.
func (s *Source) HorizonHint(retention time.Duration) string {
	h, _ := s.RedeliveryHorizon(context.Background())
	return fmt.Sprintf("%s may send an event again up to %v after its first request; keep claims at least that long (the store's retention, now %v), or, if the provider's retries are known to end sooner, say so with horizon= on the webhook URL",
		s.c.profile.Name(), h, retention)
}

// Receive implements driver.Source: it returns the next verified request,
// whose sender waits for its settlement.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	for {
		s.mu.Lock()
		closed, window := s.closed, s.window
		s.mu.Unlock()
		if closed {
			return nil, driver.ErrSourceClosed
		}
		// A slot of the window is reserved before waiting for a request,
		// so that receivers waiting at once cannot take more than it.
		if n := s.slots.Load(); window > 0 && n >= int64(window) {
			select {
			case <-s.room.Wait():
			case <-s.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		} else if !s.slots.CompareAndSwap(n, n+1) {
			continue
		} else if window > 0 && n+1 < int64(window) {
			s.room.Made() // room is one token: pass it on to another waiting receiver
		}
		select {
		case d := <-s.queue:
			s.handed.Add(1)
			return d, nil
		case <-s.done:
			s.freeSlot()
			return nil, driver.ErrSourceClosed
		case <-ctx.Done():
			s.freeSlot()
			return nil, ctx.Err()
		}
	}
}

// freeSlot gives back a slot of the window, when a delivery is settled or
// a receiver stops waiting, and wakes a receiver waiting for one.
func (s *Source) freeSlot() {
	s.slots.Add(-1)
	s.room.Made()
}

// Close implements driver.Source: requests arriving from now on, and those
// waiting for Receive, are answered 503; a request already handed out
// waits up to WithWait more for its settlement, then is answered 503 and
// its settlement is stale. A Source that Open serves shuts its server
// down, waiting for those answers.
func (s *Source) Close() error {
	s.mu.Lock()
	closed := s.closed
	s.closed = true
	s.mu.Unlock()
	if closed {
		return nil
	}
	close(s.done)
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.wait+2*time.Second)
	defer cancel()
	// A request on a fresh connection after this would be answered 503:
	// closing the connection instead makes the sender retry all the same.
	s.mu.Lock()
	for c := range s.fresh {
		_ = c.Close()
	}
	s.mu.Unlock()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	<-s.served
	if err != nil {
		return fmt.Errorf("webhook: shutting down the server on %s: %w", s.ln.Addr(), err)
	}
	return nil
}

// Addr returns the address the server Open started listens on, nil for a
// Source that NewSource made.
func (s *Source) Addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// outcome is the answer a request gets.
type outcome struct {
	status     int
	retryAfter time.Duration // for 409 and 503
	text       string
	// handled: the Consumer decided the request (or it was parked), so a
	// copy waiting for it takes the same answer; otherwise the copy tries
	// itself.
	handled bool
}

// flight is the copy of an event that a Source queued or handed out;
// later copies of the event wait for its outcome.
type flight struct {
	done chan struct{} // closed once out is set
	out  outcome
}

// end records f's outcome and takes it out of the Source.
func (s *Source) end(id string, f *flight, o outcome) {
	s.mu.Lock()
	if s.flights[id] == f {
		delete(s.flights, id)
	}
	s.mu.Unlock()
	f.out = o
	close(f.done)
}

// ServeHTTP implements http.Handler: it verifies a POST, hands it to the
// Consumer through Receive and answers once the Consumer settled it (see
// the package documentation for the statuses).
func (s *Source) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := s.c.now()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reply(w, outcome{status: http.StatusMethodNotAllowed, text: "POST only"})
		return
	}
	if s.isClosed() {
		reply(w, s.unavailable("closed"))
		return
	}
	if r.ContentLength > s.c.maxBody {
		reply(w, outcome{status: http.StatusRequestEntityTooLarge, text: "body over " + strconv.FormatInt(s.c.maxBody, 10) + " bytes"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.c.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			reply(w, outcome{status: http.StatusRequestEntityTooLarge, text: "body over " + strconv.FormatInt(s.c.maxBody, 10) + " bytes"})
		} else {
			reply(w, outcome{status: http.StatusBadRequest, text: "body not read in full"})
		}
		return
	}
	ev, err := s.c.profile.Verify(r.Header, body, arrived)
	switch {
	case errors.Is(err, signature.ErrNoID):
		p := s.parked(requestOf(r), body, "", 1, arrived, err.Error())
		reply(w, s.park(p, nil))
		return
	case err != nil:
		s.log.Log().Warn("idemq webhook: request refused", "path", r.URL.Path, "client", r.RemoteAddr, "error", err)
		reply(w, outcome{status: http.StatusUnauthorized, text: sentinel(err)})
		return
	}
	s.serve(w, r, ev.ID, body, arrived)
}

// sentinel is the signature error's answer to the sender: which check
// failed, no more.
func sentinel(err error) string {
	for _, e := range []error{signature.ErrNoSignature, signature.ErrMalformed, signature.ErrBadSignature, signature.ErrTimestamp} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "not verified"
}

// serve hands a verified request to the Consumer, unless a copy of its
// event is in flight, and answers it.
func (s *Source) serve(w http.ResponseWriter, r *http.Request, id string, body []byte, arrived time.Time) {
	timer := time.NewTimer(time.Until(arrived.Add(s.c.wait)))
	defer timer.Stop()
	ctx := r.Context()
	var f *flight
	for f == nil {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			reply(w, s.unavailable("closed"))
			return
		}
		first := s.flights[id]
		if first == nil {
			f = &flight{done: make(chan struct{})}
			s.flights[id] = f
		}
		s.mu.Unlock()
		if first == nil {
			break
		}
		s.copies.Add(1)
		o, stop := outcome{}, true
		select {
		case <-first.done:
			o, stop = first.out, first.out.handled
		case <-timer.C:
			o = outcome{status: http.StatusConflict, retryAfter: s.c.wait, text: "an earlier copy of this event is still being processed"}
		case <-s.done:
			o = s.unavailable("closed")
		case <-ctx.Done():
			o = cancelled
		}
		s.copies.Add(-1)
		if stop {
			reply(w, o)
			return
		}
	}
	d := s.newDelivery(r, id, body, arrived, f)
	select {
	case s.queue <- d:
	case <-timer.C:
		o := s.unavailable("busy: the consumer did not take the request in time")
		s.end(id, f, o)
		reply(w, o)
		return
	case <-s.done:
		o := s.unavailable("closed")
		s.end(id, f, o)
		reply(w, o)
		return
	case <-ctx.Done():
		s.end(id, f, outcome{})
		reply(w, cancelled)
		return
	}
	answerBy := time.NewTimer(time.Until(arrived.Add(s.c.answerBy)))
	defer answerBy.Stop()
	select {
	case o := <-d.res:
		reply(w, o)
	case <-ctx.Done(): // the sender is gone; the delivery still settles
		reply(w, cancelled)
	case <-answerBy.C:
		// Past the bound the sender would time out: it retries after the
		// answer, and its copy waits for this delivery's settlement or,
		// once settled, is a Duplicate.
		reply(w, s.unavailable("still being processed: send it again later"))
	case <-s.done:
		grace := time.NewTimer(s.c.wait)
		defer grace.Stop()
		select {
		case o := <-d.res:
			reply(w, o)
		case <-ctx.Done():
			reply(w, cancelled)
		case <-grace.C:
			if d.givenBack.Store(true); d.Claim() == nil {
				o := s.unavailable("closed")
				s.finish(d, o)
				reply(w, o)
			} else {
				reply(w, <-d.res) // its settlement is under way
			}
		}
	}
}

func (s *Source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// unavailable is a 503 the sender retries after the wait bound.
func (s *Source) unavailable(why string) outcome {
	return outcome{status: http.StatusServiceUnavailable, retryAfter: s.c.wait, text: why}
}

// cancelled answers a request whose context ended before its answer: the
// sender is most likely gone, but a handler that wrote nothing would make
// net/http answer 200.
var cancelled = outcome{status: http.StatusServiceUnavailable, retryAfter: time.Second, text: "request cancelled before its answer"}

// reply writes o.
func reply(w http.ResponseWriter, o outcome) {
	if o.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfter(o.retryAfter), 10))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(o.status)
	_, _ = io.WriteString(w, o.text+"\n")
}

// retryAfter is d in whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// parked returns the record of a request to park.
func (s *Source) parked(r request, body []byte, id string, attempt int, arrived time.Time, cause string) *ParkedRequest {
	return &ParkedRequest{ID: id, Cause: cause, Attempt: attempt, Profile: s.c.profile.Name(), Method: r.method,
		Path: r.path, RemoteAddr: r.remote, ReceivedAt: arrived, Headers: r.header, Body: body}
}

// park writes p to the park directory: 200 once it is written, 503 (the
// sender sends it again) when it could not be. A non-nil err receives the
// write's error.
func (s *Source) park(p *ParkedRequest, err *error) outcome {
	p.ParkedAt = s.c.now()
	p.Cause = deadletter.Cause(errors.New(p.Cause))
	path, perr := park(s.c.parkDir, p)
	if err != nil {
		*err = perr
	}
	if perr != nil {
		s.log.Log().Error("idemq webhook: parking a request failed; answering 503 so that the sender retries", "id", p.ID, "error", perr)
		return outcome{status: http.StatusServiceUnavailable, retryAfter: s.c.wait, text: "could not park the request", handled: true}
	}
	s.log.Log().Warn("idemq webhook: request parked", "id", p.ID, "file", path, "cause", p.Cause)
	return outcome{status: http.StatusOK, text: "parked", handled: true}
}

// Delivery states.
// delivery is one verified request handed out by a Source.
type delivery struct {
	s    *Source
	id   string // the event id, the flight's key (an IDFunc may change m.ID)
	m    driver.Message
	f    *flight
	r    request
	body []byte
	res  chan outcome // buffered: the settlement never waits for the handler
	driver.SettleOnce
	givenBack atomic.Bool // Close answered the request itself: a settlement is stale
}

// request is what a delivery keeps of its request, which may end before
// the delivery is settled.
type request struct {
	method, path, remote string
	header               http.Header
}

func requestOf(r *http.Request) request {
	return request{r.Method, r.URL.Path, r.RemoteAddr, r.Header.Clone()}
}

func (s *Source) newDelivery(r *http.Request, id string, body []byte, arrived time.Time, f *flight) *delivery {
	d := &delivery{s: s, id: id, f: f, r: requestOf(r), body: body, res: make(chan outcome, 1)}
	h := make(map[string]string, len(r.Header))
	for k, v := range d.r.header {
		if len(v) > 0 {
			h[strings.ToLower(k)] = v[0]
		}
	}
	d.m = driver.Message{ID: id, Body: body, Headers: h, Source: r.URL.Path, System: System,
		Attempt: s.attempts.Last(id) + 1, ReceivedAt: arrived}
	d.m.Metadata = (*metadata)(d)
	return d
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the request's method, path and client address, and the
// signature profile that verified it.
func (m *metadata) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		client := m.r.remote
		if host, _, err := net.SplitHostPort(client); err == nil {
			client = host
		}
		_ = yield("http.request.method", m.r.method) &&
			yield("url.path", m.r.path) &&
			yield("client.address", client) &&
			yield("webhook.profile", m.s.c.profile.Name())
	}
}

// finish ends d's flight and answers its request with o, in this order:
// a copy the sender sends once it read the answer is a new delivery.
func (s *Source) finish(d *delivery, o outcome) {
	s.end(d.id, d.f, o)
	d.res <- o
	s.handed.Add(-1)
	s.freeSlot()
}

// settle claims d's settlement: nil, or ErrAlreadySettled, or a stale
// error when Close gave d back (the flag is set before Close claims it, so
// a settlement that loses to Close is told it is stale).
func (d *delivery) settle() error {
	err := d.Claim()
	if err != nil && d.givenBack.Load() {
		return driver.Stale(unsettled.ErrClosed)
	}
	return err
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return &d.m }

// Ack implements driver.Delivery: the request is answered 200.
func (d *delivery) Ack(context.Context) error {
	if err := d.settle(); err != nil {
		return err
	}
	d.s.attempts.Forget(d.id)
	d.s.finish(d, outcome{status: http.StatusOK, text: "ok", handled: true})
	return nil
}

// Retry implements driver.Delivery: the request is answered 503 with
// Retry-After delay (in seconds, at least 1), and the sender sends it
// again; the next copy's Attempt is one more.
func (d *delivery) Retry(_ context.Context, delay time.Duration) error {
	if err := d.settle(); err != nil {
		return err
	}
	d.s.attempts.Requeued(d.id, d.m.Attempt)
	d.s.finish(d, outcome{status: http.StatusServiceUnavailable, retryAfter: max(delay, time.Second), text: "retry later", handled: true})
	return nil
}

// DeadLetter implements driver.Delivery: the request is parked in a file
// and answered 200; if the file cannot be written, it is answered 503 (the
// sender sends it again) and DeadLetter returns the error.
func (d *delivery) DeadLetter(_ context.Context, cause error) error {
	if err := d.settle(); err != nil {
		return err
	}
	var err error
	o := d.s.park(d.s.parked(d.r, d.body, d.id, d.m.Attempt, d.m.ReceivedAt, deadletter.Cause(cause)), &err)
	if err != nil {
		d.s.attempts.Requeued(d.id, d.m.Attempt)
	} else {
		d.s.attempts.Forget(d.id)
	}
	d.s.finish(d, o)
	return err
}
