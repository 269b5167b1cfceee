package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// The push cases are for a driver.Pusher: a source whose sender hands it
// one message at a time and waits for the answer (an HTTP webhook inbox).
// There is no queue to publish to, read raw or reconnect to, and the
// sender's answer is the acknowledgement. The suite plays the sender, and
// the Consumer through a Receiver (the Consumer's own flow) or a
// core.Consumer.

// PushHarness describes a push source to RunPush.
type PushHarness struct {
	// Open returns a fixture around a fresh source that no other test
	// sends to. It registers its own cleanup (a server, files) with
	// t.Cleanup. Required.
	Open func(t *testing.T) *PushFixture
	// RecordsCause is true when the source keeps the dead-letter cause
	// where PushFixture.DeadLetters reads it back; the suite then checks
	// it.
	RecordsCause bool
	// OperatesDeadLetters is true when admin.OpenDeadLetters opens what the
	// source parked (PushFixture.SourceURL); the suite then lists and
	// purges parked messages through it.
	OperatesDeadLetters bool
	// ReceiveTimeout bounds how long a message that must arrive, or an
	// answer that must come, may take. Default 10s.
	ReceiveTimeout time.Duration
	// Quiet is how long the suite waits to conclude that nothing more
	// arrives. Default 500ms.
	Quiet time.Duration
}

// PushFixture is one fresh push source and a sender to it.
type PushFixture struct {
	// Source is the driver.Pusher Send reaches. The suite starts it (a
	// Receiver or a core.Consumer runs its Serve) and closes it. A request
	// waiting for room in the Consumer's window, or a copy it holds back
	// while an earlier copy is unsettled, waits longer than
	// PushHarness.Quiet before the source answers it busy; once the
	// Consumer closed it, every request is answered within
	// PushHarness.ReceiveTimeout. Required.
	Source driver.Source
	// Send sends m as the source's senders do: authenticated, the id where
	// they carry it (none when m.ID is ""), m.Headers as headers the
	// source hands back under the same names. It returns once the source
	// answered; an error means no answer came (the connection failed).
	// Send is called from several goroutines, also after Close. Required.
	Send func(ctx context.Context, m *driver.Message) (Answer, error)
	// DeadLetters returns the messages the source parked so far. It may
	// consume them: the suite merges successive results. Required.
	DeadLetters func(ctx context.Context) ([]DeadLetter, error)
	// SourceURL is the URL admin.OpenDeadLetters opens the source's parked
	// messages with. Required with PushHarness.OperatesDeadLetters.
	SourceURL string

	r *Receiver // drives Source as a Consumer, for the direct cases
}

// Answer is what the sender of a pushed message was told, as the fixture
// reads the source's reply.
type Answer struct {
	// Accepted says the sender is done with the message: the source
	// acknowledged it, found it a duplicate or parked it (HTTP 2xx).
	// Otherwise the sender is to send it again.
	Accepted bool
	// RetryAfter is how long a sender not accepted is asked to wait before
	// it sends again (HTTP Retry-After); 0 when the reply names no delay.
	RetryAfter time.Duration
	// Detail describes the reply in failure messages, such as "503 retry
	// later".
	Detail string
}

// String describes the answer: its Detail, or its fields.
func (a Answer) String() string {
	if a.Detail != "" {
		return a.Detail
	}
	return fmt.Sprintf("accepted=%v retry-after=%v", a.Accepted, a.RetryAfter)
}

func (h PushHarness) withDefaults() PushHarness {
	timeoutDefaults(&h.ReceiveTimeout, &h.Quiet)
	return h
}

// pull is the harness as the helpers shared with Run read it.
func (h PushHarness) pull() Harness {
	return Harness{RecordsCause: h.RecordsCause, OperatesDeadLetters: h.OperatesDeadLetters,
		ReceiveTimeout: h.ReceiveTimeout, Quiet: h.Quiet}
}

// pull is the fixture as the helpers shared with Run read it: its dead
// letters and its URL.
func (f *PushFixture) pull() *Fixture {
	return &Fixture{DeadLetters: f.DeadLetters, SourceURL: f.SourceURL}
}

// RunPush runs every case of the push suite, the contract of a
// driver.Pusher, as a subtest of t: the settlement contract seen from the
// sender's side (Ack answers accepted, Retry answers retry-later with at
// least the delay asked, the sender waiting it out (Traits.DelaysRetry),
// DeadLetter parks and answers accepted, Release at the Consumer's Close
// answers retry-later), the Consumer's window bounding the messages
// delivered, a graceful close with requests in flight, a sender leaving
// before its answer, copies of a message in flight held back, and the
// pipeline (core.Consumer
// and a leased Consumer with the SQLite store) counting committed effects
// per message id while the suite sends copies and resends what was not
// accepted, as a provider does.
//
//	func TestConformance(t *testing.T) {
//		brokertest.RunPush(t, brokertest.PushHarness{Open: func(t *testing.T) *brokertest.PushFixture {
//			src := … // a fresh source, served on loopback
//			return &brokertest.PushFixture{Source: src, Send: …, DeadLetters: …}
//		}})
//	}
func RunPush(t *testing.T, h PushHarness) {
	if h.Open == nil {
		t.Fatal("brokertest: PushHarness.Open is required")
	}
	h = h.withDefaults()
	cases := []pushCase{
		{"SendReceiveAck", testPushAck},
		{"SettleTwiceFails", testPushSettleTwice},
		{"RetryAnswersRetryLater", testPushRetry},
		{"DeadLetterParksAndAccepts", testPushDeadLetter},
		{"WindowBoundsDeliveries", testPushWindow},
		{"WindowBoundsConcurrentReceivers", testPushWindowConcurrent},
		{"GracefulCloseWithRequestsInFlight", testPushClose},
		{"SenderGoneStillSettles", testPushSenderGone},
		{"CopyInFlightIsHeldBack/FirstAcked", func(t *testing.T, h PushHarness) { testPushCopy(t, h, false) }},
		{"CopyInFlightIsHeldBack/FirstRetried", func(t *testing.T, h PushHarness) { testPushCopy(t, h, true) }},
		{"Pipeline/MissingIDIsDeadLettered", testPushPipelineMissingID},
		{"Pipeline/DuplicatesApplyOnce", testPushPipelineDuplicates},
		{"Pipeline/FailedHandlerIsRetriedNotDropped", testPushPipelineRetry},
		{"Pipeline/PoisonIsDeadLetteredAfterMaxAttempts", testPushPipelinePoison},
		{"Pipeline/GracefulShutdownMidStream", testPushPipelineShutdown},
		{"Leased/DuplicatesCallOutOnce", testPushLeasedDuplicates},
		{"Leased/PermanentErrorDeadLetters", testPushLeasedPermanent},
	}
	if h.OperatesDeadLetters {
		cases = append(cases, pushCase{"DeadLetterQueue/ListPurge", testPushDeadLetterQueue})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.f(t, h) })
	}
}

// pushCase is one case of RunPush.
type pushCase struct {
	name string
	f    func(*testing.T, PushHarness)
}

// fixture opens a fixture, checks it is complete and closes its source
// when the test ends. Its receiver is not started: see driven.
func (h PushHarness) fixture(t *testing.T) *PushFixture {
	t.Helper()
	f := h.Open(t)
	if f == nil || f.Source == nil || f.Send == nil || f.DeadLetters == nil {
		t.Fatal("brokertest: PushFixture needs Source, Send and DeadLetters")
	}
	if _, ok := f.Source.(driver.Pusher); !ok {
		t.Fatalf("brokertest: the push suite's source %T is not a driver.Pusher", f.Source)
	}
	if h.OperatesDeadLetters && f.SourceURL == "" {
		t.Fatal("brokertest: PushFixture.SourceURL is required with OperatesDeadLetters")
	}
	t.Cleanup(func() { _ = f.Source.Close() })
	return f
}

// driven opens a fixture whose source a Receiver drives with a window of
// n (0: DefaultWindow).
func (h PushHarness) driven(t *testing.T, n int) *PushFixture {
	t.Helper()
	f := h.fixture(t)
	f.r = StartReceiver(t, f.Source, n)
	return f
}

// reply is what one Send returned.
type reply struct {
	a   Answer
	err error
}

// sendAsync sends m in the background; its reply arrives on the channel.
func sendAsync(h PushHarness, f *PushFixture, m *driver.Message) <-chan reply {
	c := make(chan reply, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*h.ReceiveTimeout)
		defer cancel()
		a, err := f.Send(ctx, m)
		c <- reply{a, err}
	}()
	return c
}

// answerOf waits for the reply on c and fails unless an answer came.
func answerOf(t *testing.T, h PushHarness, c <-chan reply, what string) Answer {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: no answer: %v", what, r.err)
		}
		return r.a
	case <-time.After(2 * h.ReceiveTimeout):
		t.Fatalf("%s: no answer within %v", what, 2*h.ReceiveTimeout)
		return Answer{}
	}
}

// unanswered fails if the sender on c already has its answer: it must
// wait for the settlement.
func unanswered(t *testing.T, c <-chan reply, what string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s was answered before its delivery was settled: %v (err %v)", what, r.a, r.err)
	default:
	}
}

// pushed is a fixture whose source received one delivery of each
// message, their senders waiting.
type pushed struct {
	f       *PushFixture
	msgs    []*driver.Message
	ds      []*Delivery
	answers map[string]<-chan reply // by id
}

// received opens a fixture, sends n new messages (see messages) and
// receives them all.
func (h PushHarness) received(t *testing.T, prefix string, n int) *pushed {
	t.Helper()
	p := &pushed{f: h.driven(t, 0), msgs: messages(prefix, n), answers: map[string]<-chan reply{}}
	for _, m := range p.msgs {
		p.answers[m.ID] = sendAsync(h, p.f, m)
	}
	p.ds = receive(t, h.pull(), p.f.r, n)
	for _, d := range p.ds {
		if _, ok := p.answers[d.Message().ID]; !ok {
			t.Fatalf("received unknown id %q", d.Message().ID)
		}
	}
	return p
}

// answer waits for the answer to d's sender.
func (p *pushed) answer(t *testing.T, h PushHarness, d *Delivery) Answer {
	t.Helper()
	return answerOf(t, h, p.answers[d.Message().ID], d.Message().ID)
}

func testPushAck(t *testing.T, h PushHarness) {
	p := h.received(t, "push", 3)
	checkFirstDeliveries(t, p.msgs, p.ds)
	// The quiet period also gives an answer sent on receipt time to
	// reach its sender.
	expectQuiet(t, h.pull(), p.f.r)
	for _, d := range p.ds {
		unanswered(t, p.answers[d.Message().ID], d.Message().ID)
	}
	ackAll(t, p.ds)
	for _, d := range p.ds {
		if a := p.answer(t, h, d); !a.Accepted {
			t.Errorf("%s: acked, but the sender was told %v", d.Message().ID, a)
		}
	}
	expectQuiet(t, h.pull(), p.f.r)
}

func testPushSettleTwice(t *testing.T, h PushHarness) {
	p := h.received(t, "twice", 1)
	d := p.ds[0]
	ctx := ctxFor(t, h.ReceiveTimeout)
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("a second Ack = %v, want driver.ErrAlreadySettled", err)
	}
	if err := d.Retry(ctx, 0); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("Retry after Ack = %v, want driver.ErrAlreadySettled", err)
	}
	if err := d.DeadLetter(ctx, errors.New("late")); !errors.Is(err, driver.ErrAlreadySettled) {
		t.Errorf("DeadLetter after Ack = %v, want driver.ErrAlreadySettled", err)
	}
	if a := p.answer(t, h, d); !a.Accepted {
		t.Errorf("acked, but the sender was told %v", a)
	}
	expectQuiet(t, h.pull(), p.f.r)
	if dls, err := p.f.DeadLetters(ctx); err != nil || len(dls) != 0 {
		t.Errorf("DeadLetters after a refused DeadLetter = %v, %v; want none", dls, err)
	}
}

func testPushRetry(t *testing.T, h PushHarness) {
	p := h.received(t, "retry", 1)
	d1 := p.ds[0]
	const delay = 1500 * time.Millisecond
	if err := d1.Retry(ctxFor(t, h.ReceiveTimeout), delay); err != nil {
		t.Fatalf("retry: %v", err)
	}
	a := p.answer(t, h, d1)
	if a.Accepted {
		t.Fatalf("retried, but the sender was told %v: it will not send the message again", a)
	}
	if a.RetryAfter < delay {
		t.Errorf("retry-later answer %v asks for %v, less than the %v delay", a, a.RetryAfter, delay)
	}
	if !p.f.r.Traits().DelaysRetry {
		t.Error("Traits.DelaysRetry is false, but the sender waits out the delay it is told")
	}
	// The sender sends its next copy.
	m := p.msgs[0]
	again := sendAsync(h, p.f, m)
	d2 := receive(t, h.pull(), p.f.r, 1)[0]
	if got := d2.Message(); got.ID != m.ID || string(got.Body) != string(m.Body) {
		t.Fatalf("received %q %q, want the copy %q %q", got.ID, got.Body, m.ID, m.Body)
	}
	if n, first := d2.Message().Attempt, d1.Message().Attempt; n <= first {
		t.Errorf("the copy sent after a Retry has Attempt %d, want more than %d", n, first)
	}
	ackAll(t, []*Delivery{d2})
	if a := answerOf(t, h, again, "the copy"); !a.Accepted {
		t.Errorf("the copy was acked, but its sender was told %v", a)
	}
	expectQuiet(t, h.pull(), p.f.r)
}

func testPushDeadLetter(t *testing.T, h PushHarness) {
	p := h.received(t, "dl", 2)
	parked, acked := p.ds[0], p.ds[1]
	cause := "brokertest cause " + randomHex(4)
	if err := parked.DeadLetter(ctxFor(t, h.ReceiveTimeout), errors.New(cause)); err != nil {
		t.Fatalf("dead-letter: %v", err)
	}
	ackAll(t, []*Delivery{acked})
	for _, d := range p.ds {
		if a := p.answer(t, h, d); !a.Accepted {
			t.Errorf("%s: settled, but the sender was told %v: a parked message must not come back", d.Message().ID, a)
		}
	}
	expectQuiet(t, h.pull(), p.f.r)
	wantParked(t, h.pull(), p.f.pull(), parked, acked, cause)
}

func testPushWindow(t *testing.T, h PushHarness) {
	if r, err := NewReceiver(context.Background(), h.fixture(t).Source, 0, slog.Default()); err == nil {
		_ = r.Close()
		t.Error("a window of 0 was accepted")
	}
	f := h.driven(t, 2)
	msgs := messages("window", 3)
	answers := map[string]<-chan reply{}
	for _, m := range msgs {
		answers[m.ID] = sendAsync(h, f, m)
	}
	ds := receive(t, h.pull(), f.r, 2)
	// Two unsettled: the third waits, unanswered.
	expectQuiet(t, h.pull(), f.r)
	for _, m := range msgs {
		if m.ID != ds[0].Message().ID && m.ID != ds[1].Message().ID {
			unanswered(t, answers[m.ID], "the request beyond the window")
		}
	}
	ackAll(t, ds[:1])
	ds = append(ds[1:], receive(t, h.pull(), f.r, 1)...)
	expectQuiet(t, h.pull(), f.r)
	ackAll(t, ds)
	for _, m := range msgs {
		if a := answerOf(t, h, answers[m.ID], m.ID); !a.Accepted {
			t.Errorf("%s: acked, but the sender was told %v", m.ID, a)
		}
	}
}

// testPushWindowConcurrent: with a window of 1, two goroutines receiving
// at once hold one unsettled message between them, not one each.
func testPushWindowConcurrent(t *testing.T, h PushHarness) {
	f := h.driven(t, 1)
	msgs := messages("wconc", 3)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *Delivery, len(msgs))
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				d, err := f.r.Receive(ctx)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				got <- d
			}
		})
	}
	answers := map[string]<-chan reply{}
	for _, m := range msgs {
		answers[m.ID] = sendAsync(h, f, m)
	}
	for range msgs {
		var d *Delivery
		select {
		case d = <-got:
		case <-time.After(h.ReceiveTimeout):
			t.Fatalf("no delivery within %v", h.ReceiveTimeout)
		}
		select {
		case d2 := <-got:
			t.Fatalf("window 1: %s handed out while %s is unsettled", d2.Message().ID, d.Message().ID)
		case <-time.After(h.Quiet):
		}
		ackAll(t, []*Delivery{d})
	}
	for _, m := range msgs {
		if a := answerOf(t, h, answers[m.ID], m.ID); !a.Accepted {
			t.Errorf("%s: acked, but the sender was told %v", m.ID, a)
		}
	}
}

// testPushClose: Close with three requests in flight, one settled before.
// A settlement after Close either succeeds, and the sender is accepted, or
// is stale, and the sender is told to send again; a delivery left
// unsettled is answered send-again, after which its settlement is stale.
// New requests are not accepted.
func testPushClose(t *testing.T, h PushHarness) {
	p := h.received(t, "close", 3)
	ackAll(t, p.ds[:1])
	if a := p.answer(t, h, p.ds[0]); !a.Accepted {
		t.Errorf("acked before Close, but the sender was told %v", a)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.f.r.Close() }()
	// Receive returns once Close took effect.
	if _, err := p.f.r.Receive(ctxFor(t, h.ReceiveTimeout)); !errors.Is(err, driver.ErrSourceClosed) {
		t.Fatalf("Receive after Close = %v, want driver.ErrSourceClosed", err)
	}
	ctx := ctxFor(t, 2*h.ReceiveTimeout)
	settled := p.ds[1]
	err := settled.Ack(ctx)
	a := p.answer(t, h, settled)
	switch {
	case err == nil && !a.Accepted:
		t.Errorf("Ack after Close succeeded, but the sender was told %v", a)
	case errors.Is(err, driver.ErrStaleDelivery) && a.Accepted:
		t.Errorf("Ack after Close was stale, but the sender was told %v", a)
	case err != nil && !errors.Is(err, driver.ErrStaleDelivery):
		t.Errorf("Ack after Close = %v, want nil or an error wrapping driver.ErrStaleDelivery", err)
	}
	t.Logf("Ack after Close: %v; the sender was told %v", err, a)

	left := p.ds[2]
	if a := p.answer(t, h, left); a.Accepted {
		t.Errorf("a delivery left unsettled at Close was answered %v: the sender drops a message never processed", a)
	}
	if err := left.Ack(ctx); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack of a delivery whose sender was already answered = %v, want an error wrapping driver.ErrStaleDelivery", err)
	}
	if a, err := p.f.Send(ctx, messages("late", 1)[0]); err == nil && a.Accepted {
		t.Errorf("a request sent after Close was answered %v", a)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
	if err := p.f.r.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// testPushCopy: a copy of a message sent while the first is unsettled is
// not handed out until the first is settled. Once it is, the copy is
// accepted only if a delivery of the message was acknowledged: after a
// Retry of the first, the copy is told to send again or handed out anew.
func testPushCopy(t *testing.T, h PushHarness, retryFirst bool) {
	p := h.received(t, "copy", 1)
	d1, m := p.ds[0], p.msgs[0]
	copied := sendAsync(h, p.f, m)
	expectQuiet(t, h.pull(), p.f.r)

	ctx := ctxFor(t, 2*h.ReceiveTimeout)
	var err error
	if retryFirst {
		err = d1.Retry(ctx, 0)
	} else {
		err = d1.Ack(ctx)
	}
	if err != nil {
		t.Fatalf("settling the first: %v", err)
	}
	if a := p.answer(t, h, d1); a.Accepted == retryFirst {
		t.Errorf("the first copy's sender was told %v (retried: %v)", a, retryFirst)
	}
	a, acked := ackUntilAnswered(t, h, p.f, copied, "the copy")
	t.Logf("the copy was told %v; acked after the first: %v", a, acked)
	if retryFirst && a.Accepted && len(acked) == 0 {
		t.Errorf("the copy was accepted, but the first was retried and no delivery of %s was acknowledged: the message is lost", m.ID)
	}
}

// ackUntilAnswered acknowledges whatever f's source hands out until the
// sender on c is answered, and returns the answer and the ids it acked.
func ackUntilAnswered(t *testing.T, h PushHarness, f *PushFixture, c <-chan reply, what string) (Answer, []string) {
	t.Helper()
	var mu sync.Mutex
	var acked []string
	ctx, stop := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for ctx.Err() == nil {
			d, err := f.r.Receive(ctx)
			if err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if d.Ack(ctx) == nil {
				mu.Lock()
				acked = append(acked, d.Message().ID)
				mu.Unlock()
			}
		}
	}()
	defer func() { stop(); <-drained }()
	a := answerOf(t, h, c, what)
	stop()
	<-drained
	return a, acked
}

// testPushSenderGone: a sender that leaves before its answer is not
// accepted, and changes nothing for the delivery, which still settles (or
// is stale); the sender's next copy is accepted.
func testPushSenderGone(t *testing.T, h PushHarness) {
	f := h.driven(t, 0)
	m := messages("gone", 1)[0]
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	gone := make(chan reply, 1)
	go func() {
		a, err := f.Send(ctx, m)
		gone <- reply{a, err}
	}()
	d := receive(t, h.pull(), f.r, 1)[0]
	leave()
	select {
	case r := <-gone:
		if r.err == nil && r.a.Accepted {
			t.Errorf("a sender that left before the settlement was accepted: %v", r.a)
		}
	case <-time.After(h.ReceiveTimeout):
		t.Fatalf("Send did not return within %v of its context's end", h.ReceiveTimeout)
	}
	if err := d.Ack(ctxFor(t, h.ReceiveTimeout)); err != nil && !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("Ack after the sender left = %v, want nil or an error wrapping driver.ErrStaleDelivery", err)
	}
	if a, acked := ackUntilAnswered(t, h, f, sendAsync(h, f, m), "the next copy"); !a.Accepted {
		t.Errorf("the sender's next copy was told %v (acked meanwhile: %v)", a, acked)
	}
}

// committed returns how many times id's effect was committed; unlike
// Counts it may be called off the test's goroutine.
func (e *Effects) committed(ctx context.Context, id string) (int, error) {
	var n int
	err := e.store.DB().QueryRowContext(ctx, `SELECT count(*) FROM effects WHERE id = ?`, id).Scan(&n)
	return n, err
}

// deliver sends m until the source accepts it, as a provider resends what
// was not accepted (sooner than asked: the suite does not wait out
// RetryAfter), and returns the answers in order.
func deliver(ctx context.Context, f *PushFixture, m *driver.Message) ([]Answer, error) {
	var out []Answer
	for {
		a, err := f.Send(ctx, m)
		if err == nil {
			out = append(out, a)
			if a.Accepted {
				return out, nil
			}
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("%q not accepted (answers %v, last error %v): %w", m.ID, out, err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// deliverAll delivers msgs concurrently (see deliver), calling accepted
// from each sender's goroutine once its message is accepted; an error it
// returns fails the test. It returns each message's answers.
func deliverAll(t *testing.T, h PushHarness, f *PushFixture, msgs []*driver.Message, accepted func(context.Context, *driver.Message) error) [][]Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*h.ReceiveTimeout)
	defer cancel()
	out := make([][]Answer, len(msgs))
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			out[i], errs[i] = deliver(ctx, f, m)
			if errs[i] == nil && accepted != nil {
				errs[i] = accepted(ctx, m)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}

// appliedWhenAccepted checks, for deliverAll, that a message's effect is
// committed exactly once by the time its sender is accepted.
func appliedWhenAccepted(e *Effects) func(context.Context, *driver.Message) error {
	return func(ctx context.Context, m *driver.Message) error {
		n, err := e.committed(ctx, m.ID)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("%s: its sender was accepted with %d effects committed, want 1", m.ID, n)
		}
		return nil
	}
}

// copiesOf returns msgs, then msgs again, copies times in all.
func copiesOf(msgs []*driver.Message, copies int) []*driver.Message {
	var all []*driver.Message
	for range copies {
		all = append(all, msgs...)
	}
	return all
}

// apply is a handler that applies e's effect.
func apply(e *Effects) core.Handler[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx, m *core.Message) error { return e.Apply(ctx, tx, m) }
}

func testPushPipelineMissingID(t *testing.T, h PushHarness) {
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("noid", 2)
	noID := &driver.Message{Body: []byte("no-id-" + randomHex(4))}
	var handled sync.Map
	r := runConsumer(t, f.Source, e, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		handled.Store(string(m.Body), true)
		return e.Apply(ctx, tx, m)
	})
	applied := appliedWhenAccepted(e)
	deliverAll(t, h, f, []*driver.Message{msgs[0], noID, msgs[1]}, func(ctx context.Context, m *driver.Message) error {
		if m.ID == "" {
			return nil
		}
		return applied(ctx, m)
	})
	r.finishWhen(t, h.ReceiveTimeout, "2 processed", func(st core.Stats) bool { return st.Processed == 2 })
	if _, ok := handled.Load(string(noID.Body)); ok {
		t.Error("the handler ran for a message without an id")
	}
	dl := waitDeadLetters(t, h.pull(), f.pull(), "")[""]
	if string(dl.Body) != string(noID.Body) {
		t.Errorf("parked body %q, want %q", dl.Body, noID.Body)
	}
	if h.RecordsCause && dl.Cause == "" {
		t.Error("the message without an id was parked without a cause")
	}
	t.Logf("parked without an id, cause %q", dl.Cause)
	if counts := e.WantOnce(t, msgs); len(counts) != len(msgs) {
		t.Errorf("effects for %d ids, want %d: %v", len(counts), len(msgs), counts)
	}
}

// Every id sent three times, the copies concurrently, through a batching
// Consumer with two workers: each applied once, each sender accepted only
// once its effect is committed.
func testPushPipelineDuplicates(t *testing.T, h PushHarness) {
	const unique, copies = 20, 3
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("dup", unique)
	r := runConsumer(t, f.Source, e, apply(e), core.WithConcurrency(2), core.WithBatchSize(5), core.WithWindow(10), core.WithLinger(5*time.Millisecond))
	deliverAll(t, h, f, copiesOf(msgs, copies), appliedWhenAccepted(e))
	st := r.finishWhen(t, h.ReceiveTimeout, fmt.Sprintf("%d processed", unique), func(st core.Stats) bool { return st.Processed >= unique })
	t.Logf("consumer stats: %+v", st)
	if st.Processed != unique {
		t.Errorf("Processed = %d, want %d", st.Processed, unique)
	}
	e.WantOnce(t, msgs)
}

func testPushPipelineRetry(t *testing.T, h PushHarness) {
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("flaky", 10)
	// The sender of a failed first try is told to send again, and its next
	// copy is not taken for a duplicate.
	r := runConsumer(t, f.Source, e, flakyHandler(e), core.WithBatchSize(4), core.WithWindow(8))
	answers := deliverAll(t, h, f, msgs, appliedWhenAccepted(e))
	st := r.finishWhen(t, h.ReceiveTimeout, "10 processed", func(st core.Stats) bool { return st.Processed == 10 })
	if st.Retried != 5 || st.Duplicates != 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v: want 5 retried, no duplicates, none dead-lettered", st)
	}
	for i, m := range msgs {
		if failsFirstTry(m.ID) && answers[i][0].Accepted {
			t.Errorf("%s: its failed first try was answered %v", m.ID, answers[i][0])
		}
	}
	e.WantOnce(t, msgs)
}

// A message whose handler always fails transiently reaches MaxAttempts
// through the Attempt the source counts over the sender's copies, and is
// parked, its sender accepted; it is not retried forever.
func testPushPipelinePoison(t *testing.T, h PushHarness) {
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("poison", 2)
	poison := msgs[0].ID
	var calls atomic.Int64
	r := runConsumer(t, f.Source, e, poisonHandler(e, poison, &calls), core.WithMaxAttempts(3))
	applied := appliedWhenAccepted(e)
	answers := deliverAll(t, h, f, msgs, func(ctx context.Context, m *driver.Message) error {
		if m.ID == poison {
			return nil
		}
		return applied(ctx, m)
	})
	t.Logf("the poison message's sender was told %v", answers[0])
	r.finishWhen(t, h.ReceiveTimeout, "the poison message dead-lettered", func(st core.Stats) bool {
		return st.DeadLettered == 1 && st.Processed == 1
	})
	if n := calls.Load(); n != 3 {
		t.Errorf("handler ran %d times for the poison message, want MaxAttempts = 3", n)
	}
	dl := waitDeadLetters(t, h.pull(), f.pull(), poison)[poison]
	if h.RecordsCause && !strings.Contains(dl.Cause, core.ErrMaxAttempts.Error()) {
		t.Errorf("parked cause %q does not name %q", dl.Cause, core.ErrMaxAttempts)
	}
	counts := e.Counts(t)
	if counts[poison] != 0 || counts[msgs[1].ID] != 1 {
		t.Errorf("effects %v: want none for the poison message and one for the other", counts)
	}
}

// The Consumer is cancelled while requests stream in: Run returns nil, and
// each sender's answer agrees with the database: accepted if and only if
// its effect was committed (once).
func testPushPipelineShutdown(t *testing.T, h PushHarness) {
	const n = 40
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("shutdown", n)
	slow := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		time.Sleep(10 * time.Millisecond)
		return e.Apply(ctx, tx, m)
	}
	r := runConsumer(t, f.Source, e, slow, core.WithBatchSize(4), core.WithWindow(8))
	answers := make([]<-chan reply, n)
	for i, m := range msgs {
		answers[i] = sendAsync(h, f, m)
	}
	waitFor(t, h.ReceiveTimeout, "10 processed", func() bool { return r.c.Stats().Processed >= 10 })
	if err := r.shutdown(t); err != nil {
		t.Fatalf("Run after cancellation = %v, want nil", err)
	}
	counts := e.Counts(t)
	accepted := 0
	for i, m := range msgs {
		var a Answer
		select {
		case rep := <-answers[i]:
			if rep.err != nil {
				// No answer at all: the sender sends again, as after a
				// refusal.
				t.Logf("%s: %v", m.ID, rep.err)
			}
			a = rep.a
		case <-time.After(2 * h.ReceiveTimeout):
			t.Fatalf("%s: no answer within %v of the shutdown", m.ID, 2*h.ReceiveTimeout)
		}
		switch {
		case a.Accepted && counts[m.ID] != 1:
			t.Errorf("%s: its sender was accepted with %d effects committed, want 1", m.ID, counts[m.ID])
		case a.Accepted:
			accepted++
		case counts[m.ID] != 0:
			t.Errorf("%s: applied, but its sender was told %v: the shutdown left a decided message unsettled", m.ID, a)
		}
	}
	st := r.c.Stats()
	t.Logf("%d of %d accepted; consumer stats %+v", accepted, n, st)
	if accepted == n {
		t.Fatalf("all %d accepted before the shutdown took effect", n)
	}
	if st.Processed != int64(accepted) {
		t.Errorf("Processed = %d, but %d senders were accepted", st.Processed, accepted)
	}
}

// Copies of each id sent concurrently to a leased Consumer whose External
// call is slow: each id calls out once and applies once.
func testPushLeasedDuplicates(t *testing.T, h PushHarness) {
	const unique, copies = 15, 3
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("leased", unique)
	var calls externalCalls
	external := func(ctx context.Context, m *core.Message) (string, error) {
		calls.add(m.ID)
		time.Sleep(30 * time.Millisecond)
		return "charged", nil
	}
	r := runLeased(t, f.Source, e, external, 0, 0, core.WithWindow(10), core.WithBatchSize(5))
	deliverAll(t, h, f, copiesOf(msgs, copies), appliedWhenAccepted(e))
	st := r.finishWhen(t, h.ReceiveTimeout, fmt.Sprintf("%d processed", unique), func(st core.Stats) bool { return st.Processed >= unique })
	if st.Processed != unique {
		t.Errorf("Processed = %d, want %d", st.Processed, unique)
	}
	wantOnce(t, e, msgs)
	for _, m := range msgs {
		if n := calls.of(m.ID); n != 1 {
			t.Errorf("%s: External called %d times, want once", m.ID, n)
		}
	}
}

// A permanent External error parks the message with its cause and
// accepts its sender; the rest complete.
func testPushLeasedPermanent(t *testing.T, h PushHarness) {
	f := h.fixture(t)
	e := NewEffects(t)
	msgs := messages("declined", 4)
	bad := msgs[1].ID
	r := runLeased(t, f.Source, e, declines(bad), 0, 0)
	applied := appliedWhenAccepted(e)
	deliverAll(t, h, f, msgs, func(ctx context.Context, m *driver.Message) error {
		if m.ID == bad {
			return nil
		}
		return applied(ctx, m)
	})
	r.finishWhen(t, h.ReceiveTimeout, "3 processed and 1 dead-lettered", func(st core.Stats) bool {
		return st.Processed == 3 && st.DeadLettered == 1
	})
	dl := waitDeadLetters(t, h.pull(), f.pull(), bad)[bad]
	if h.RecordsCause && !strings.Contains(dl.Cause, "card declined") {
		t.Errorf("parked cause %q does not say why", dl.Cause)
	}
	wantOnce(t, e, append(msgs[:1:1], msgs[2:]...))
}

// testPushDeadLetterQueue: messages the source parked are listed through
// admin.OpenDeadLetters with their id, cause, attempt, origin, time,
// headers and body, and stay parked while listed. A redrive either is
// refused (a push source's sender alone can send a copy it takes),
// leaving everything parked, or hands the message to the source again.
// Purge deletes the chosen ones.
func testPushDeadLetterQueue(t *testing.T, h PushHarness) {
	hp := h.pull()
	begin := time.Now()
	p := h.received(t, "dlq", 4)
	q := openDLQ(t, p.f.pull())
	all := parkAll(t, hp, q, p.msgs, p.ds, begin)
	for _, d := range p.ds {
		if a := p.answer(t, h, d); !a.Accepted {
			t.Errorf("%s: parked, but the sender was told %v", d.Message().ID, a)
		}
	}
	waitParked(t, hp, q, all...)
	expectQuiet(t, hp, p.f.r)

	rest := all
	n, err := admin.Redrive(ctxFor(t, h.ReceiveTimeout), q, only(all[0]), nil)
	if err != nil {
		t.Logf("Redrive refused: %v", err)
		if n != 0 {
			t.Errorf("a refused Redrive reports %d redriven", n)
		}
	} else {
		if n != 1 {
			t.Fatalf("Redrive = %d, want 1", n)
		}
		ackAll(t, receiveExactly(t, hp, p.f.r, "after Redrive", all[:1]))
		rest = all[1:]
	}
	waitParked(t, hp, q, rest...)
	if n, err := q.Purge(ctxFor(t, h.ReceiveTimeout), only(rest[0])); err != nil || n != 1 {
		t.Fatalf("Purge %s = %d, %v; want 1, nil", rest[0], n, err)
	}
	waitParked(t, hp, q, rest[1:]...)
	if n, err := q.Purge(ctxFor(t, h.ReceiveTimeout), func(*admin.Parked) bool { return true }); err != nil || n != len(rest)-1 {
		t.Fatalf("Purge all = %d, %v; want %d, nil", n, err, len(rest)-1)
	}
	waitParked(t, hp, q)
}
