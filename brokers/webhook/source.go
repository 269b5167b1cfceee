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
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// System is the Message.System of every message a Source receives.
const System = "webhook"

// maxRemembered bounds the events whose attempt count a Source keeps.
const maxRemembered = 10000

var (
	_ driver.Pusher   = (*Source)(nil)
	_ driver.Releaser = (*Source)(nil)
)

// errAnswered is why a settlement is stale: the Source answered the
// request itself (it closed, or the request outlived its bounds).
var errAnswered = errors.New("webhook: the request was already answered 503; its sender sends it again")

// Source is an HTTP endpoint as a broker: an http.Handler a service mounts
// in its own server (or that Open serves), and a driver.Pusher whose
// messages are the verified requests, each answered once the Consumer
// settled it.
type Source struct {
	c        config
	logger   atomic.Pointer[slog.Logger] // WithLogger's, else the Consumer's
	attempts *attempts.Memo[string]
	copies   atomic.Int64   // requests waiting for an earlier copy's answer
	serving  chan struct{}  // closed when Serve starts
	done     chan struct{}  // closed by Close
	active   sync.WaitGroup // deliver calls under way; added to under mu until Serve stops

	mu      sync.Mutex
	flights map[string]*request // by event id: the copy the Consumer has or may take
	deliver driver.Deliver
	dctx    context.Context // deliver calls', cancelled when Serve stops
	stopped bool            // Serve stopped: no deliver call from now on
	closed  bool

	// Set when Open serves the Source itself.
	srv    *http.Server
	ln     net.Listener
	served chan struct{}
	fresh  map[net.Conn]struct{} // connections that have not sent a request yet; under mu
}

// track keeps the served connections that have not sent a request yet:
// http.Server.Shutdown takes one for idle only once it is 5 s old, which
// would hold Close up to its deadline.
func (s *Source) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state == http.StateNew {
		s.fresh[c] = struct{}{}
	} else {
		delete(s.fresh, c)
	}
}

// NewSource returns a Source configured by opts; WithProfile and
// WithParkDir are required.
func NewSource(opts ...Option) (*Source, error) {
	return build(nil, opts, func(err error) error { return err })
}

func (s *Source) log() *slog.Logger {
	if l := s.logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// Start implements driver.Source: the Source logs to the Consumer's
// logger unless WithLogger gave one, and its sender waits out a retry's
// delay (Retry-After).
func (s *Source) Start(_ context.Context, st driver.Setup) (driver.Traits, error) {
	if st.Logger != nil {
		s.logger.CompareAndSwap(nil, st.Logger)
	}
	return driver.Traits{DelaysRetry: true}, nil
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

// Serve implements driver.Pusher: each verified request is handed to
// deliver until ctx is done or the Source is closed (then it returns
// driver.ErrSourceClosed); then requests are answered 503, and Serve
// returns once no deliver call is under way. Requests that arrive before
// Serve wait for it up to WithWait.
func (s *Source) Serve(ctx context.Context, deliver driver.Deliver) error {
	dctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return driver.ErrSourceClosed
	case s.deliver != nil: // set once, kept when Serve stopped
		s.mu.Unlock()
		return errors.New("webhook: Serve called twice")
	}
	s.deliver, s.dctx = deliver, dctx
	close(s.serving)
	s.mu.Unlock()
	var err error
	select {
	case <-ctx.Done():
	case <-s.done:
		err = driver.ErrSourceClosed
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	stop()
	s.active.Wait()
	return err
}

// Close implements driver.Source: requests are answered 503 from now on,
// and so are those waiting (for Serve, for room, for an earlier copy). A
// Source that Open serves shuts its server down, waiting for the answers.
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
		err = fmt.Errorf("webhook: shutting down the server on %s: %w", s.ln.Addr(), errors.Join(err, s.srv.Close()))
	}
	<-s.served
	return err
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
	// handled: the request was decided or parked, so a copy waiting for
	// it takes the same answer; otherwise the copy tries itself.
	handled bool
}

// request is one verified request (its message's AckID): what parking it
// keeps, and its answer, which later copies of its event wait for.
type request struct {
	id                   string // the event id, the flight's key (an IDFunc may change m.ID)
	m                    driver.Message
	method, path, remote string
	header               http.Header // kept: the request may end before its settlement
	profile              string
	once                 sync.Once     // answers it
	done                 chan struct{} // closed once out is set
	out                  outcome
}

func (s *Source) newRequest(r *http.Request, body []byte, arrived time.Time) *request {
	return &request{m: driver.Message{Body: body, Source: r.URL.Path, System: System, ReceivedAt: arrived},
		method: r.Method, path: r.URL.Path, remote: r.RemoteAddr, header: r.Header.Clone(),
		profile: s.c.profile.Name(), done: make(chan struct{})}
}

// answer gives q the answer o returns unless q has one (then it returns
// errAnswered, stale), ending q's flight first: a copy the sender sends
// once it read the answer is a new delivery.
func (s *Source) answer(q *request, o func() (outcome, error)) (err error) {
	err = driver.Stale(errAnswered)
	q.once.Do(func() {
		var out outcome
		out, err = o()
		s.mu.Lock()
		if s.flights[q.id] == q {
			delete(s.flights, q.id)
		}
		s.mu.Unlock()
		q.out = out
		close(q.done)
	})
	return err
}

// ServeHTTP implements http.Handler: it verifies a POST, hands it to the
// Consumer and answers once the Consumer settled it (see the package
// documentation for the statuses).
func (s *Source) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply(w, s.take(w, r))
}

// take reads and verifies r and returns its answer.
func (s *Source) take(w http.ResponseWriter, r *http.Request) outcome {
	arrived := s.c.now()
	tooLarge := outcome{status: http.StatusRequestEntityTooLarge, text: "body over " + strconv.FormatInt(s.c.maxBody, 10) + " bytes"}
	switch {
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		return outcome{status: http.StatusMethodNotAllowed, text: "POST only"}
	case r.ContentLength > s.c.maxBody:
		return tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.c.maxBody))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return tooLarge
	} else if err != nil {
		return outcome{status: http.StatusBadRequest, text: "body not read in full"}
	}
	ev, err := s.c.profile.Verify(r.Header, body, arrived)
	switch {
	case errors.Is(err, signature.ErrNoID):
		o, _ := s.park(s.newRequest(r, body, arrived), err.Error())
		return o
	case err != nil:
		s.log().Warn("idemq webhook: request refused", "path", r.URL.Path, "client", r.RemoteAddr, "error", err)
		return outcome{status: http.StatusUnauthorized, text: sentinel(err)}
	}
	q := s.newRequest(r, body, arrived)
	q.id = ev.ID
	return s.serve(r.Context(), q)
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

// serve hands q to the Consumer once no earlier copy of its event is in
// flight (or takes that copy's answer), and returns the answer for its
// sender, whose request's context is ctx.
func (s *Source) serve(ctx context.Context, q *request) outcome {
	waitBy := time.NewTimer(time.Until(q.m.ReceivedAt.Add(s.c.wait)))
	defer waitBy.Stop()
	for {
		s.mu.Lock()
		if s.closed || s.stopped {
			s.mu.Unlock()
			return s.unavailable("closed")
		}
		first := s.flights[q.id]
		if first == nil {
			s.flights[q.id] = q
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		s.copies.Add(1)
		o, stop := outcome{}, true
		select {
		case <-first.done:
			o, stop = first.out, first.out.handled
		case <-waitBy.C:
			o = outcome{status: http.StatusConflict, retryAfter: s.c.wait, text: "an earlier copy of this event is still being processed"}
		case <-s.done:
			o = s.unavailable("closed")
		case <-ctx.Done():
			o = cancelled
		}
		s.copies.Add(-1)
		if stop {
			return o
		}
	}
	// The attempt is read once the copies before it are settled.
	q.m.ID, q.m.Attempt, q.m.AckID, q.m.Metadata = q.id, s.attempts.Last(q.id)+1, q, (*metadata)(q)
	q.m.Headers = make(map[string]string, len(q.header))
	for k, v := range q.header {
		if len(v) > 0 {
			q.m.Headers[strings.ToLower(k)] = v[0]
		}
	}
	go s.run(q)
	answerBy := time.NewTimer(time.Until(q.m.ReceivedAt.Add(s.c.answerBy)))
	defer answerBy.Stop()
	select {
	case <-q.done:
		return q.out
	case <-ctx.Done(): // the sender is gone; the message still settles
		return cancelled
	case <-answerBy.C:
		// Past it the sender would time out; its next copy waits for this
		// one's settlement or, once settled, is a Duplicate.
		return s.unavailable("still being processed: send it again later")
	}
}

// run hands q to Serve's deliver once Serve runs, waiting for it and for
// room in the Consumer's window up to the wait bound; unless a settlement
// answered q, it answers 503.
func (s *Source) run(q *request) {
	by := q.m.ReceivedAt.Add(s.c.wait)
	wait, late := time.NewTimer(time.Until(by)), false
	select {
	case <-s.serving:
	case <-s.done:
	case <-wait.C:
		late = true // Serve did not start in time
	}
	wait.Stop()
	s.mu.Lock()
	if deliver, dctx := s.deliver, s.dctx; !late && deliver != nil && !s.closed && !s.stopped {
		s.active.Add(1)
		s.mu.Unlock()
		ctx, cancel := context.WithDeadline(dctx, by)
		err := deliver(ctx, &q.m)
		cancel()
		s.active.Done()
		if err == nil {
			return // settled: its settlement answered it
		}
		s.mu.Lock()
	}
	why := "busy: the consumer did not take the request in time"
	if s.closed || s.stopped {
		why = "closed"
	}
	s.mu.Unlock()
	_ = s.answer(q, func() (outcome, error) { return s.unavailable(why), nil })
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
		// In whole seconds, rounded up, at least 1.
		w.Header().Set("Retry-After", strconv.FormatInt(max(int64((o.retryAfter+time.Second-1)/time.Second), 1), 10))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(o.status)
	_, _ = io.WriteString(w, o.text+"\n")
}

// metadata is a request's Message.Metadata, read from it when asked.
type metadata request

// All yields the request's method, path and client address, and the
// signature profile that verified it.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		client := m.remote
		if host, _, err := net.SplitHostPort(client); err == nil {
			client = host
		}
		_ = yield("http.request.method", slog.StringValue(m.method)) &&
			yield("url.path", slog.StringValue(m.path)) &&
			yield("client.address", slog.StringValue(client)) &&
			yield("webhook.profile", slog.StringValue(m.profile))
	}
}

// settle answers each request of ms with what answer returns for it; a
// request the Source already answered itself is stale.
func (s *Source) settle(ms []*driver.Message, answer func(i int, q *request) (outcome, error)) error {
	errs := make([]error, len(ms))
	for i, m := range ms {
		q := m.AckID.(*request)
		errs[i] = s.answer(q, func() (outcome, error) { return answer(i, q) })
	}
	return driver.PartialOf(errs)
}

// Ack implements driver.Source: each request is answered 200.
func (s *Source) Ack(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, func(_ int, q *request) (outcome, error) {
		s.attempts.Forget(q.id)
		return outcome{status: http.StatusOK, text: "ok", handled: true}, nil
	})
}

// Retry implements driver.Source: each request is answered 503 with
// Retry-After delay (in seconds, rounded up, at least 1), and its sender
// sends it again; the next copy's Attempt is one more.
func (s *Source) Retry(_ context.Context, ms []*driver.Message, delay time.Duration) error {
	return s.settle(ms, func(_ int, q *request) (outcome, error) {
		s.attempts.Requeued(q.id, q.m.Attempt)
		return outcome{status: http.StatusServiceUnavailable, retryAfter: max(delay, time.Second), text: "retry later", handled: true}, nil
	})
}

// DeadLetter implements driver.Source: each request is parked in a file
// and answered 200; one whose file cannot be written is answered 503 (its
// sender sends it again) and reported failed.
func (s *Source) DeadLetter(_ context.Context, ms []*driver.Message, causes []error) error {
	return s.settle(ms, func(i int, q *request) (outcome, error) {
		o, err := s.park(q, deadletter.Cause(causes[i]))
		if err != nil {
			s.attempts.Requeued(q.id, q.m.Attempt)
		} else {
			s.attempts.Forget(q.id)
		}
		return o, err
	})
}

// Release implements driver.Releaser: each request is answered 503, and
// its sender sends it again.
func (s *Source) Release(_ context.Context, ms []*driver.Message) error {
	return s.settle(ms, func(int, *request) (outcome, error) { return s.unavailable("closed"), nil })
}
