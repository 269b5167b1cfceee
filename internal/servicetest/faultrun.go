package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mathrand "math/rand/v2"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Effect is the business effect of one message of a fault scenario: an
// amount booked to an account. The handler inserts it as a row of a table
// without a unique key, so a message applied twice shows as two rows.
type Effect struct {
	ID      string
	Account string
	Amount  int64
}

// FaultScenario is one run of a Consumer through a fault of its store,
// for RunFaultScenario. The broker is RabbitMQ (IDEMQ_AMQP_URL, default
// the local one) with a queue of the run's own: the adapter must be
// registered, that is brokers/rabbitmq imported by the test.
type FaultScenario[Tx any] struct {
	// Scenario and StoreName name the run in its FAULT-MATRIX line.
	Scenario, StoreName string
	// Unique is the number of distinct message ids; a fifth of them are
	// published a second time (a producer's retry), shuffled in.
	Unique int
	// Store is the store the Consumer runs over.
	Store driver.Store[Tx]
	// Apply inserts e in tx; the handler turns its error into a
	// core.Permanent one unless IsTransient reports it transient, as a
	// service's handler does, so a failover error classified wrongly
	// dead-letters a message and the run counts it lost.
	Apply       func(ctx context.Context, tx Tx, e Effect) error
	IsTransient func(error) bool
	// Effects reads every committed effect row, after the run, from the
	// server that takes writes by then.
	Effects func(ctx context.Context) ([]Effect, error)
	// Fault breaks the store once a third of the messages are decided,
	// and calls down at the moment its server stopped: the recovery time
	// runs from there to the next committed effect. The Consumer is not
	// restarted: it must recover by itself.
	Fault func(down func())
	// Timeout bounds the whole run (default 2 minutes).
	Timeout time.Duration
}

// FaultResult is what RunFaultScenario measured.
type FaultResult struct {
	// Messages is the number of messages published, duplicates included.
	Messages int
	// Lost counts ids without a committed effect; Doubled counts effect
	// rows beyond the first of an id.
	Lost, Doubled int
	// Recovery is the time from the store's stop to the next committed
	// effect.
	Recovery time.Duration
	// Stats are the Consumer's counts at the end.
	Stats core.Stats
}

// faultBody is the JSON body of a fault scenario's message.
type faultBody struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// RunFaultScenario publishes sc.Unique messages plus 20% duplicates to a
// fresh RabbitMQ queue, consumes them with a Consumer over sc.Store
// (batches of 50, two workers), breaks the store with sc.Fault a third of
// the way through, waits until the queue is empty and every delivery is
// decided, and checks the committed effects: each id exactly once, each
// account's balance exact, nothing dead-lettered, nothing left in the
// queue once the Consumer has stopped. It logs one line
// "FAULT-MATRIX | scenario | rabbitmq | store | messages=N lost=L
// doubled=D recovery=…" and fails t when anything is lost or doubled.
func RunFaultScenario[Tx any](t *testing.T, sc FaultScenario[Tx]) FaultResult {
	t.Helper()
	if sc.Timeout == 0 {
		sc.Timeout = 2 * time.Minute
	}
	amqpURL := RabbitMQURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	queue := "idemq-fault-" + hex.EncodeToString(b)
	DeleteQueuesAtCleanup(t, amqpURL, queue)
	srcURL := amqpURL + "?queue=" + queue
	if strings.Contains(amqpURL, "?") {
		srcURL = amqpURL + "&queue=" + queue
	}
	ctx, cancel := context.WithTimeout(context.Background(), sc.Timeout)
	defer cancel()

	logs := &Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	src, err := core.OpenSource(ctx, srcURL, core.WithAdapterLogger(logger)) // declares the queue
	if err != nil {
		t.Fatal(err)
	}
	// The messages: ids with an account and an amount each; a fifth sent
	// twice.
	want := make(map[string]Effect, sc.Unique)
	msgs := make([]*core.Message, 0, sc.Unique*6/5)
	for i := range sc.Unique {
		e := Effect{ID: fmt.Sprintf("pay-%06d", i), Account: fmt.Sprintf("acct-%02d", i%17), Amount: int64(i%97 + 1)}
		want[e.ID] = e
		body, _ := json.Marshal(faultBody{Account: e.Account, Amount: e.Amount})
		msgs = append(msgs, &core.Message{ID: e.ID, Body: body})
	}
	for _, i := range mathrand.Perm(sc.Unique)[:sc.Unique/5] {
		msgs = append(msgs, msgs[i])
	}
	mathrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	pub, err := core.OpenPublisher(ctx, srcURL)
	if err != nil {
		src.Close()
		t.Fatal(err)
	}
	for chunk := range slices.Chunk(msgs, 1000) {
		if err := pub.Publish(ctx, "", chunk...); err != nil {
			pub.Close()
			src.Close()
			t.Fatal(err)
		}
	}
	pub.Close()

	handler := func(ctx context.Context, tx Tx, m *core.Message) error {
		if ran, ok := ctx.Value(startKey{}).(*atomic.Int64); ok {
			ran.Store(time.Now().UnixNano())
		}
		var fb faultBody
		if err := json.Unmarshal(m.Body, &fb); err != nil {
			return core.Permanent(err)
		}
		err := sc.Apply(ctx, tx, Effect{ID: m.ID, Account: fb.Account, Amount: fb.Amount})
		if err != nil && !sc.IsTransient(err) {
			return core.Permanent(err)
		}
		return err
	}
	obs := &recoveryObserver{}
	c, err := core.New[Tx](src, sc.Store, handler, core.WithName("fault"),
		core.WithBatchSize(50), core.WithConcurrency(2), core.WithMaxAttempts(100),
		core.WithBackoff(core.ExponentialBackoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond, Multiplier: 2, Jitter: 0.2}),
		core.WithObserver(obs), core.WithLogger(logger))
	if err != nil {
		src.Close()
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(runCtx) }()
	fail := func(format string, args ...any) {
		t.Helper()
		stop()
		<-done
		t.Fatalf(format+"\nconsumer stats: %+v\nlast consumer log:\n%s", append(args, c.Stats(), tail(logs.String(), 4000))...)
	}

	faulted := false
	var last core.Stats
	stableSince := time.Time{}
	for tick := time.NewTicker(100 * time.Millisecond); ; <-tick.C {
		if ctx.Err() != nil {
			fail("run not finished after %v", sc.Timeout)
		}
		st := c.Stats()
		decided := st.Processed + st.Duplicates + st.Retried + st.DeadLettered
		if !faulted && decided >= int64(len(msgs)/3) {
			faulted = true
			t.Logf("fault after %d decisions (%v into the run)", decided, time.Since(start).Round(time.Millisecond))
			sc.Fault(obs.down)
			t.Logf("fault over %v after the stop", time.Since(obs.downAt()).Round(time.Millisecond))
		}
		if !faulted || st.Received != decided || st.Received < int64(len(msgs)) || queueDepth(amqpURL, queue) != 0 {
			stableSince = time.Time{}
			continue
		}
		// Nothing in the queue, nothing undecided: done once that holds,
		// with no new decision, for longer than the longest retry delay.
		if st != last || stableSince.IsZero() {
			last, stableSince = st, time.Now()
			continue
		}
		if time.Since(stableSince) > 1500*time.Millisecond {
			break
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	elapsed := time.Since(start)
	res := FaultResult{Messages: len(msgs), Stats: c.Stats(), Recovery: obs.recovery()}

	// The effects: each id once, balances exact.
	rows, err := sc.Effects(context.Background())
	if err != nil {
		t.Fatalf("read the effects: %v", err)
	}
	count := make(map[string]int, len(rows))
	balance := make(map[string]int64)
	for _, e := range rows {
		count[e.ID]++
		balance[e.Account] += e.Amount
		if w, ok := want[e.ID]; !ok || w != e {
			t.Errorf("effect %+v was never published", e)
		}
	}
	wantBalance := make(map[string]int64)
	for id, e := range want {
		wantBalance[e.Account] += e.Amount
		switch n := count[id]; {
		case n == 0:
			res.Lost++
		case n > 1:
			res.Doubled += n - 1
		}
	}
	for _, acct := range slices.Sorted(maps.Keys(wantBalance)) {
		if balance[acct] != wantBalance[acct] {
			t.Errorf("balance of %s: %d, want %d", acct, balance[acct], wantBalance[acct])
		}
	}
	left := queueDepth(amqpURL, queue) // unacked deliveries are back in the queue now
	t.Logf("FAULT-MATRIX | %s | rabbitmq | %s | messages=%d lost=%d doubled=%d recovery=%v",
		sc.Scenario, sc.StoreName, res.Messages, res.Lost, res.Doubled, res.Recovery.Round(time.Millisecond))
	t.Logf("run took %v; stats %+v; retry causes seen: %s", elapsed.Round(time.Millisecond), res.Stats, obs.causes())
	if res.Lost > 0 || res.Doubled > 0 {
		t.Errorf("%d ids lost, %d effects doubled", res.Lost, res.Doubled)
	}
	if res.Stats.DeadLettered > 0 {
		t.Errorf("%d messages dead-lettered: a failover error was taken for a permanent one\n%s", res.Stats.DeadLettered, tail(logs.String(), 4000))
	}
	if left != 0 {
		t.Errorf("%d messages left in the queue after the run", left)
	}
	if res.Recovery <= 0 {
		t.Error("no effect committed after the fault")
	}
	return res
}

// queueDepth returns how many messages wait in queue, or -1 when the
// broker cannot tell.
func queueDepth(url, queue string) int {
	conn, err := amqp.Dial(url)
	if err != nil {
		return -1
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return -1
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// recoveryObserver notes when the store went down and the end of the
// first Processed decision whose handler ran after it; it also keeps a
// few of the Retry causes it sees.
type recoveryObserver struct {
	downNanos atomic.Int64 // time.Time.UnixNano of the stop; 0 before
	recovered atomic.Int64 // when the first effect after it committed; 0 before

	mu   sync.Mutex
	seen map[string]int
}

type startKey struct{}

// messageRef and claimCount are the parts of a retry cause that differ
// between messages, taken out so that causes of one kind count together.
var (
	messageRef = regexp.MustCompile(`message "[^"]*"`)
	claimCount = regexp.MustCompile(`claim \d+ ids`)
)

func (o *recoveryObserver) down() { o.downNanos.Store(time.Now().UnixNano()) }

func (o *recoveryObserver) downAt() time.Time { return time.Unix(0, o.downNanos.Load()) }

func (o *recoveryObserver) recovery() time.Duration {
	d, r := o.downNanos.Load(), o.recovered.Load()
	if d == 0 || r == 0 {
		return 0
	}
	return time.Duration(r - d)
}

// StartDecision gives the decision a place where the handler records
// when it ran.
func (o *recoveryObserver) StartDecision(ctx context.Context, _ *core.Message) context.Context {
	return context.WithValue(ctx, startKey{}, new(atomic.Int64))
}

// EndDecision records the first commit after the stop, and the causes of
// retries.
func (o *recoveryObserver) EndDecision(ctx context.Context, _ *core.Message, out core.Outcome) {
	now := time.Now().UnixNano()
	d := o.downNanos.Load()
	switch {
	case out.Decision == core.Processed && d != 0:
		// The handler ran after the stop: the commit that followed went
		// to a server that was up again.
		if ran, _ := ctx.Value(startKey{}).(*atomic.Int64); ran != nil && ran.Load() >= d {
			o.recovered.CompareAndSwap(0, now)
		}
	case out.Decision == core.Retry && out.Err != nil:
		cause := out.Err.Error()
		if i := strings.IndexAny(cause, "\n"); i >= 0 {
			cause = cause[:i]
		}
		cause = messageRef.ReplaceAllString(cause, "message …")
		cause = claimCount.ReplaceAllString(cause, "claim N ids")
		o.mu.Lock()
		if o.seen == nil {
			o.seen = make(map[string]int)
		}
		if _, ok := o.seen[cause]; ok || len(o.seen) < 8 {
			o.seen[cause]++
		}
		o.mu.Unlock()
	}
}

func (o *recoveryObserver) causes() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	for _, c := range slices.Sorted(maps.Keys(o.seen)) {
		fmt.Fprintf(&b, "\n\t%d× %s", o.seen[c], c)
	}
	return b.String()
}
