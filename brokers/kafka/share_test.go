package kafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/sqlite"
)

// testLock is the record lock the share-group tests' clusters give share
// groups: long enough for a batch, short enough that a lapse fits in a
// test.
const testLock = 2 * time.Second

// shareCluster starts a kfake cluster (bench/cmd/kfake, a process of its
// own) with share groups locking records for testLock, sweeping lapsed
// locks every 100ms, and archiving a record after limit deliveries; it
// returns the brokers. IDEMQ_KAFKA_URL is not used: a real cluster's
// share-group settings are not the tests' to change.
func shareCluster(t testing.TB, limit int) string {
	t.Helper()
	if os.Getenv(servicetest.KafkaEnv) != "" {
		t.Logf("%s is set; share-group tests run on kfake all the same (they set the cluster's lock and delivery limit)", servicetest.KafkaEnv)
	}
	return servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false",
		"-config", "group.share.record.lock.duration.ms="+strconv.Itoa(int(testLock/time.Millisecond)),
		"-config", "share.record.lock.sweep.interval.ms=100",
		"-config", "group.share.delivery.count.limit="+strconv.Itoa(limit),
		"-config", "group.share.heartbeat.interval.ms=200",
		"-config", "group.share.session.timeout.ms=3000")
}

// produce writes msgs to topic with franz-go, the id in the message-id
// header (none when empty).
func produce(t testing.TB, bs, topic string, msgs ...*driver.Message) {
	t.Helper()
	var rs []*kgo.Record
	for _, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: m.Body}
		if m.ID != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "message-id", Value: []byte(m.ID)})
		}
		for k, v := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		rs = append(rs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := client(t, bs).ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// shareURL is the kafka+share:// URL of topic in group.
func shareURL(bs, topic, group, params string) string {
	u := "kafka+share://" + bs + "/" + topic + "?group=" + group
	if params != "" {
		u += "&" + params
	}
	return u
}

// openShare opens a ShareSource, closed when t ends.
func openShare(t testing.TB, url string, opts ...Option) *ShareSource {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := OpenShare(ctx, url, opts...)
	if err != nil {
		t.Fatalf("OpenShare: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// lapsing is a ShareSource whose lock renewals fail while lapse is set, so
// that the records it holds lapse as a member's cut off from the broker.
type lapsing struct {
	*ShareSource
	lapse atomic.Bool
}

func (l *lapsing) Extend(ctx context.Context, ms []*driver.Message) error {
	if l.lapse.Load() {
		return errors.New("test: renewals cut off")
	}
	return l.ShareSource.Extend(ctx, ms)
}

// shareHarness runs the conformance suite on a fresh topic of 2 partitions
// and a fresh share group per fixture, on a cluster that locks records for
// testLock; the suite's messages are published by the kafka:// Publisher.
func shareHarness() brokertest.Harness {
	return brokertest.Harness{
		RecordsCause:   true,
		CarriesKey:     true,
		ReceiveTimeout: 15 * time.Second,
		// Not the dead-letter case: its redrive publishes the copies one
		// at a time, and the suite waits for both while holding the first,
		// which a share source that takes more only once its poll is
		// settled (WindowRefillsWhole) may have taken alone.
		// TestShareDeadLettersOperated covers admin.OpenDeadLetters here.
		OperatesDeadLetters: false,
		WindowRefillsWhole:  true,
		Open: func(t *testing.T) *brokertest.Fixture {
			bs := shareCluster(t, 10)
			topic := newTopic(t, bs, 2)
			group := "g-" + randomHex(3)
			url := shareURL(bs, topic, group, "")
			openShare(t, url).Close() // sets the group's share.auto.offset.reset
			pub, err := NewPublisher(context.Background(), bs, WithTopic(topic))
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			t.Cleanup(func() { pub.Close() })
			dlq := client(t, bs, kgo.ConsumeTopics(topic+".dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			return &brokertest.Fixture{
				Publish: func(ctx context.Context, msgs ...*driver.Message) error { return pub.Publish(ctx, "", msgs...) },
				NewSource: func(t *testing.T) driver.Source {
					s, err := OpenShare(context.Background(), url)
					if err != nil {
						t.Fatalf("OpenShare: %v", err)
					}
					return &lapsing{ShareSource: s}
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					var out []brokertest.DeadLetter
					for _, r := range pollSome(ctx, dlq) {
						h := headersOf(r)
						out = append(out, brokertest.DeadLetter{ID: h["message-id"], Body: r.Value, Cause: h[driver.CauseHeader]})
					}
					return out, nil
				},
				Reconnect: func(t *testing.T, src driver.Source) {
					// Renewals fail until every lock the member held has
					// lapsed at the broker (its sweep comes every 100ms) and
					// the Consumer gave its records up.
					l := src.(*lapsing)
					l.lapse.Store(true)
					time.Sleep(2 * testLock) // the lock's lapse is the behaviour under test
					l.lapse.Store(false)
				},
				NewPublisher: func(t *testing.T) driver.Publisher {
					p, err := NewPublisher(context.Background(), bs, WithTopic(topic))
					if err != nil {
						t.Fatalf("NewPublisher: %v", err)
					}
					return p
				},
				Raw: func(ctx context.Context) (brokertest.RawMessage, error) {
					r, err := rawNext(ctx, bs, topic, group)
					if err != nil {
						return brokertest.RawMessage{}, err
					}
					h := headersOf(r)
					return brokertest.RawMessage{ID: h["message-id"], Key: string(r.Key), Headers: h, Body: r.Value}, nil
				},
				SourceURL:    url,
				PublisherURL: "kafka://" + bs + "/" + topic,
			}
		},
	}
}

func TestShareConformance(t *testing.T) {
	brokertest.Run(t, shareHarness())
}

// rawNext takes one record off topic as a member of group, which joins
// for it and leaves (a member fetches records as soon as it joins, and
// holds what it fetched until it leaves).
func rawNext(ctx context.Context, bs, topic, group string) (*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bs, ",")...), kgo.ConsumeTopics(topic), kgo.ShareGroup(group),
		kgo.ShareMaxRecords(1), kgo.ShareMaxRecordsStrict())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		return nil, err
	}
	rs := fs.Records()
	if len(rs) == 0 {
		return nil, errors.New("no record")
	}
	for _, r := range rs {
		r.Ack(kgo.AckAccept)
	}
	return rs[0], cl.FlushAcks(ctx)
}

// pollSome returns the records cl has, waiting up to a second for some.
func pollSome(ctx context.Context, cl *kgo.Client) []*kgo.Record {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.PollFetches(ctx).Records()
}

func headersOf(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// TestShareAcceptedOnce: accepted records never come back, to this member
// or another; attempts start at 1; ids come from the header.
func TestShareAcceptedOnce(t *testing.T) {
	bs := shareCluster(t, 5)
	topic := newTopic(t, bs, 2)
	var msgs []*driver.Message
	for i := range 20 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("m-%d", i), Key: fmt.Sprint(i % 3), Body: []byte("b")})
	}
	produce(t, bs, topic, msgs...)
	url := shareURL(bs, topic, "g-"+randomHex(3), "")
	s := openShare(t, url)
	if s.RecordLock() != testLock {
		t.Errorf("RecordLock %v, want the cluster's %v", s.RecordLock(), testLock)
	}
	if n, ok := s.DeliveryLimit(context.Background()); !ok || n != 5 {
		t.Errorf("DeliveryLimit %d, %v; want 5", n, ok)
	}
	r := brokertest.StartReceiver(t, s, 0)
	if tr := r.Traits(); tr.Lease != testLock*9/10 || tr.MaxExtension != time.Hour || tr.DelaysRetry {
		t.Errorf("traits %+v, want a lease a tenth short of the lock, renewed up to an hour, retries delayed by the Consumer", tr)
	}
	seen := map[string]bool{}
	for _, d := range receiveN(t, r, 20, 20*time.Second) {
		m := d.Message()
		if m.Attempt != 1 || m.System != "kafka" || m.Source != topic {
			t.Errorf("message %+v", m)
		}
		seen[m.ID] = true
		if err := d.Ack(context.Background()); err != nil {
			t.Errorf("Ack %s: %v", m.ID, err)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d distinct ids, want 20", len(seen))
	}
	r.Close()
	expectNothing(t, brokertest.StartReceiver(t, openShare(t, url), 0), 2*testLock)
}

// slowMessage publishes one record to a fresh topic and returns a source
// of a fresh group (opened with opts) holding its first delivery.
func slowMessage(t *testing.T, opts ...Option) (*brokertest.Receiver, *brokertest.Delivery, string) {
	t.Helper()
	bs := shareCluster(t, 5)
	topic := newTopic(t, bs, 1)
	produce(t, bs, topic, &driver.Message{ID: "slow", Body: []byte("b")})
	url := shareURL(bs, topic, "g-"+randomHex(3), "")
	r := brokertest.StartReceiver(t, openShare(t, url, opts...), 0)
	return r, receiveN(t, r, 1, 20*time.Second)[0], url
}

// A handler outliving the lock without renewal (max_extension passed):
// the broker delivers the record again; the first delivery's late Ack is
// stale, the copy's goes through, and nothing comes back after.
func TestShareLockLapsesWithoutRenewal(t *testing.T) {
	s, first, _ := slowMessage(t, WithMaxExtension(time.Millisecond))
	time.Sleep(testLock + testLock/2)
	again := receiveN(t, s, 1, 20*time.Second)[0]
	// 2, or 3 when the member had fetched the copy before it released
	// the lapsed delivery.
	if m := again.Message(); m.ID != "slow" || m.Attempt < 2 {
		t.Fatalf("after the lapse: %s attempt %d, want slow attempt 2 or more", m.ID, m.Attempt)
	}
	if err := first.Ack(context.Background()); !errors.Is(err, driver.ErrStaleDelivery) {
		t.Errorf("late Ack of the first delivery: %v, want a stale error", err)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatalf("Ack of the copy: %v", err)
	}
	expectNothing(t, s, 2*testLock)
}

// With renewal (the default), the record stays with its member while the
// handler takes three locks' time: no other member gets a copy, and the
// Ack goes through.
func TestShareLockRenewedForSlowHandler(t *testing.T) {
	s, first, url := slowMessage(t)
	other := brokertest.StartReceiver(t, openShare(t, url), 0)
	expectNothing(t, other, 3*testLock)
	if err := first.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after three locks' time: %v", err)
	}
	other.Close()
	expectNothing(t, s, 2*testLock)
}

// The Consumer checks its MaxAttempts against the group's delivery-count
// limit: above it, Run warns naming the share group's config, or refuses
// under WithStrictDeliveryLimit.
func TestShareDeliveryLimitChecked(t *testing.T) {
	bs := shareCluster(t, 3)
	topic := newTopic(t, bs, 1)
	url := shareURL(bs, topic, "g-"+randomHex(3), "")
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "dedup.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	handler := func(context.Context, *sql.Tx, *core.Message) error { return nil }
	for _, strict := range []bool{false, true} {
		logs := &strings.Builder{}
		var mu sync.Mutex
		opts := []core.Option{core.WithName("share-test"), core.WithMaxAttempts(5), core.WithLogger(slog.New(slog.NewTextHandler(logWriter{&mu, logs}, nil)))}
		if strict {
			opts = append(opts, core.WithStrictDeliveryLimit())
		}
		c, err := core.New[*sql.Tx](openShare(t, url), store, handler, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = c.Run(ctx)
		cancel()
		mu.Lock()
		out := logs.String()
		mu.Unlock()
		if strict {
			if err == nil || !strings.Contains(err.Error(), "share.delivery.count.limit=5") || !strings.Contains(err.Error(), "3") {
				t.Errorf("strict: Run returned %v, want a refusal naming the limit 3 and the group config to raise", err)
			}
			continue
		}
		if err != nil || !strings.Contains(out, "delivery_limit=3") || !strings.Contains(out, "max_attempts=5") {
			t.Errorf("Run: %v; log %q, want a warning naming delivery_limit=3 and max_attempts=5", err, out)
		}
	}
}

// logWriter serialises writes to w.
type logWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Records produced with kcat (librdkafka), as a service in another
// language would: the id comes from the message-id header, the key and
// body as written; a record kcat sent without the header is refused an
// id (the Consumer dead-letters it).
func TestShareProducedWithKcat(t *testing.T) {
	bs := shareCluster(t, 5)
	topic := newTopic(t, bs, 1)
	kcatProduce(t, bs, topic)
	r := brokertest.StartReceiver(t, openShare(t, shareURL(bs, topic, "g-"+randomHex(3), "")), 0)
	checkKcat(t, r)
}

// kcatProduce writes three records to topic with kcat (librdkafka), two
// with a message-id header and one without.
func kcatProduce(t *testing.T, bs, topic string) {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		servicetest.Unavailable(t, "kcat (Debian package kcat) is not installed: %v", err)
	}
	for _, m := range []struct{ id, key, body string }{{"k-1", "acct-1", `{"n":1}`}, {"k-2", "acct-2", `{"n":2}`}, {"", "acct-3", `{"n":3}`}} {
		args := []string{"-P", "-b", bs, "-t", topic, "-k", m.key}
		if m.id != "" {
			args = append(args, "-H", "message-id="+m.id)
		}
		cmd := exec.Command(kcat, args...)
		cmd.Stdin = strings.NewReader(m.body + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat %v: %v\n%s", args, err, out)
		}
	}
}

// checkKcat receives what kcatProduce wrote and checks its fields.
func checkKcat(t *testing.T, r *brokertest.Receiver) {
	t.Helper()
	got := map[string]*driver.Message{}
	for _, d := range receiveN(t, r, 3, 20*time.Second) {
		m := d.Message()
		got[m.Key] = m
		if err := d.Ack(context.Background()); err != nil {
			t.Errorf("Ack: %v", err)
		}
	}
	if m := got["acct-1"]; m == nil || m.ID != "k-1" || string(m.Body) != `{"n":1}` {
		t.Errorf("acct-1: %+v", m)
	}
	if m := got["acct-2"]; m == nil || m.ID != "k-2" {
		t.Errorf("acct-2: %+v", m)
	}
	if m := got["acct-3"]; m == nil || m.ID != "" {
		t.Errorf("acct-3 (no header): %+v, want no id", m)
	}
}

// A Retry with a delay keeps the record locked to its member until the
// delay has passed: no copy comes sooner, one comes after, as attempt 2.
func TestShareRetryWaitsOutItsDelay(t *testing.T) {
	s, first, url := slowMessage(t)
	other := brokertest.StartReceiver(t, openShare(t, url), 0)
	const delay = time.Second
	began := time.Now()
	if err := first.Retry(context.Background(), delay); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type got struct {
		d   *brokertest.Delivery
		err error
	}
	ch := make(chan got, 2)
	for _, r := range []*brokertest.Receiver{s, other} {
		go func() {
			d, err := r.Receive(ctx)
			ch <- got{d, err}
		}()
	}
	g := <-ch
	if g.err != nil {
		t.Fatalf("Receive after Retry: %v", g.err)
	}
	if waited := time.Since(began); waited < delay*9/10 {
		t.Errorf("the copy came %v after Retry(%v)", waited, delay)
	}
	if m := g.d.Message(); m.ID != "slow" || m.Attempt != 2 {
		t.Errorf("copy: %s attempt %d, want slow attempt 2", m.ID, m.Attempt)
	}
	if err := g.d.Ack(context.Background()); err != nil {
		t.Errorf("Ack of the copy: %v", err)
	}
	cancel()
	<-ch
}

// A dead letter whose copy cannot be produced (its topic does not exist
// and the cluster creates none) fails and releases the record: it comes
// back, and nothing was parked or rejected.
func TestShareDeadLetterCopyFailsReleases(t *testing.T) {
	s, first, _ := slowMessage(t, WithDeadLetterTopic("no-such-topic-"+randomHex(3)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := first.DeadLetter(ctx, errors.New("poison"))
	if err == nil || !strings.Contains(err.Error(), "released for redelivery") {
		t.Fatalf("DeadLetter: %v, want an error saying the record was released", err)
	}
	again := receiveN(t, s, 1, 20*time.Second)[0]
	if m := again.Message(); m.ID != "slow" || m.Attempt != 2 {
		t.Fatalf("after the failed dead letter: %s attempt %d, want slow attempt 2", m.ID, m.Attempt)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Errorf("Ack: %v", err)
	}
}

// admin.OpenDeadLetters takes the kafka+share:// URL: it lists what the
// source parked, with the cause; a redrive puts the copies back on the
// topic, and the share group receives them again (settled one at a time:
// the source takes more only once its poll is settled).
func TestShareDeadLettersOperated(t *testing.T) {
	bs := shareCluster(t, 5)
	topic := newTopic(t, bs, 1)
	url := shareURL(bs, topic, "g-"+randomHex(3), "")
	produce(t, bs, topic, &driver.Message{ID: "p-1", Body: []byte("one")}, &driver.Message{ID: "p-2", Body: []byte("two")})
	s := brokertest.StartReceiver(t, openShare(t, url), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		d := receiveN(t, s, 1, 20*time.Second)[0]
		if err := d.DeadLetter(ctx, errors.New("card declined")); err != nil {
			t.Fatalf("DeadLetter %s: %v", d.Message().ID, err)
		}
	}
	q, err := admin.OpenDeadLetters(ctx, url)
	if err != nil {
		t.Fatalf("admin.OpenDeadLetters: %v", err)
	}
	defer q.Close()
	parked := map[string]string{}
	for deadline := time.Now().Add(10 * time.Second); len(parked) < 2 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = q.Scan(ctx, func(p *admin.Parked) error { parked[p.ID] = p.Cause; return nil })
	}
	if len(parked) != 2 || parked["p-1"] != "card declined" || parked["p-2"] != "card declined" {
		t.Fatalf("parked %v, want p-1 and p-2 with their cause", parked)
	}
	if n, err := admin.Redrive(ctx, q, nil, nil); err != nil || n != 2 {
		t.Fatalf("Redrive = %d, %v; want 2", n, err)
	}
	back := map[string]bool{}
	for range 2 {
		d := receiveN(t, s, 1, 20*time.Second)[0]
		back[d.Message().ID] = true
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	if !back["p-1"] || !back["p-2"] {
		t.Errorf("after the redrive: %v, want p-1 and p-2", back)
	}
	expectNothing(t, s, testLock)
}

// A bad URL or option fails OpenShare before any connection, naming what
// the user wrote.
func TestShareURLErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"kafka://127.0.0.1:1/t?group=g", "kafka+share://"},
		{"kafka+share://127.0.0.1:1/?group=g", "topic"},
		{"kafka+share://127.0.0.1:1/t", "group"},
		{"kafka+share://127.0.0.1:1/t?group=g&windw=5", "windw"},
		{"kafka+share://127.0.0.1:1/t?group=g&window=10", `unknown parameter "window"`},
		{"kafka+share://127.0.0.1:1/t?group=g&max_extension=soon", "max_extension"},
		{"kafka+share://127.0.0.1:1/t?group=g&start=middle", "start"},
		{"kafka+share://127.0.0.1:1/t?group=g&ordering=none", `unknown parameter "ordering"`},
		{"kafka+share://127.0.0.1:1/t?group=g&dead_letter_topic=t", "must differ from the consumed topic"},
		{"kafka+share://u:Secr3t@127.0.0.1:1/t?group=g", "sasl"},
		{"kafka+share://127.0.0.1/t?group=g", "host:port"},
	} {
		_, err := OpenShare(context.Background(), c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "Secr3t") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
	c, err := sourceConfig("kafka+share://127.0.0.1:1,127.0.0.1:2/t?group=g&offset_id=true&start=as-is&max_extension=5m", []Option{WithIDHeader("ce_id")}, ShareScheme)
	if err != nil || len(c.brokers) != 2 || !c.offsetID || c.start != StartAsIs || c.idHeader != "ce_id" || c.deadLetterTopic != "t.dlq" || c.maxExtension != 5*time.Minute {
		t.Errorf("sourceConfig: %+v, %v", c, err)
	}
}

// A record without the id header takes topic/partition/offset as its id
// with offset_id=true, the same on every redelivery.
func TestShareOffsetID(t *testing.T) {
	bs := shareCluster(t, 5)
	topic := newTopic(t, bs, 1)
	produce(t, bs, topic, &driver.Message{Body: []byte("no id")})
	r := brokertest.StartReceiver(t, openShare(t, shareURL(bs, topic, "g-"+randomHex(3), "offset_id=true")), 0)
	d := receiveN(t, r, 1, 20*time.Second)[0]
	if id := d.Message().ID; id != topic+"/0/0" {
		t.Fatalf("id %q, want %s/0/0", id, topic)
	}
	if err := d.Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if again := receiveN(t, r, 1, 20*time.Second)[0]; again.Message().ID != topic+"/0/0" || again.Message().Attempt != 2 {
		t.Fatalf("redelivered as %q attempt %d", again.Message().ID, again.Message().Attempt)
	}
}
