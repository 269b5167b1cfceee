package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// openDLQ opens the dead letters of group on topic, closed when the test
// ends.
func openDLQ(t *testing.T, bs, topic, group string, opts ...Option) *DeadLetters {
	t.Helper()
	q, err := OpenDeadLetters(context.Background(), bs, append([]Option{WithTopic(topic), WithGroup(group)}, opts...)...)
	if err != nil {
		t.Fatalf("OpenDeadLetters: %v", err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// scanIDs lists the ids q has parked, in scan order.
func scanIDs(t *testing.T, q driver.DeadLetters) []string {
	t.Helper()
	var out []string
	if err := q.Scan(context.Background(), func(p *driver.Parked) error {
		out = append(out, p.ID)
		return nil
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// park writes n dead letters of group straight to the dead-letter topic,
// as a Source's DeadLetter does, with ids prefix-0 ... and one key each.
func park(t *testing.T, bs, topic, group, prefix string, n int) []string {
	t.Helper()
	var ids []string
	var rs []*kgo.Record
	for i := range n {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		ids = append(ids, id)
		rs = append(rs, &kgo.Record{Topic: topic + ".dlq", Key: []byte(id), Value: []byte("body of " + id), Headers: []kgo.RecordHeader{
			{Key: DefaultIDHeader, Value: []byte(id)},
			{Key: driver.CauseHeader, Value: []byte("test: parked")},
			{Key: driver.AttemptHeader, Value: []byte("1")},
			{Key: HeaderGroup, Value: []byte(group)},
			{Key: driver.OriginHeader, Value: []byte(topic + "/0/" + strconv.Itoa(i))},
			{Key: driver.DestinationHeader, Value: []byte(topic)},
		}})
	}
	if err := client(t, bs).ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatalf("parking: %v", err)
	}
	return ids
}

// A dead-letter topic larger than one fetch: 250 messages parked by a
// Source; 100 of them, chosen by id all over the topic, are redriven and
// come back once each, to the partition they were consumed from, without
// the cause and at attempt 1; the other 150
// stay parked, also for a DeadLetters opened afresh; Purge drops them and
// leaves the bookkeeping group past everything with no ranges left.
func TestDeadLettersRedriveChosenOfMany(t *testing.T) {
	bs := brokers(t)
	topic := "idemq-test-" + randomHex(5)
	createTopics(t, bs, 4, topic)
	createTopics(t, bs, 2, topic+".dlq")
	group := "idemq-test-" + randomHex(4)
	const total = 250
	pub, err := NewPublisher(context.Background(), bs, WithTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var msgs []*driver.Message
	for i := range total {
		id := fmt.Sprintf("m-%03d", i)
		msgs = append(msgs, &driver.Message{ID: id, Key: "k" + id, Body: []byte("body " + id), Headers: map[string]string{"x-test": id}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "", msgs...); err != nil {
		t.Fatal(err)
	}
	_, src := startSource(t, bs, topic, group, 0, WithOrdering(OrderNone))
	for range total {
		d, err := src.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		if err := d.DeadLetter(ctx, errors.New("bad deploy")); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}

	q := openDLQ(t, bs, topic, group)
	var all []string
	refs := map[string]bool{}
	origins := map[string]string{}
	if err := q.Scan(ctx, func(p *driver.Parked) error {
		all = append(all, p.ID)
		refs[p.Ref] = true
		origins[p.ID] = p.Origin
		if p.Cause != "bad deploy" || p.Attempt != 1 || p.Destination != topic || !strings.HasPrefix(p.Origin, topic+"/") || p.Headers["x-test"] != p.ID || p.Key != "k"+p.ID {
			t.Errorf("parked %+v", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	if len(all) != total || len(refs) != total || len(slices.Compact(slices.Clone(all))) != total {
		t.Fatalf("scanned %d ids (%d refs), want %d distinct", len(all), len(refs), total)
	}
	var back []string
	for i, id := range all {
		if i%5 < 2 {
			back = append(back, id)
		}
	}
	var progress []int
	sel := func(p *driver.Parked) bool { return slices.Contains(back, p.ID) }
	n, err := q.Redrive(ctx, sel, func(done int) { progress = append(progress, done) })
	if err != nil || n != len(back) || len(progress) != len(back) || progress[len(progress)-1] != len(back) {
		t.Fatalf("Redrive = %d, %v (progress %d calls); want %d", n, err, len(progress), len(back))
	}

	// Exactly the chosen ones come back, once each.
	got := map[string]int{}
	for len(got) < len(back) {
		d, err := src.Receive(ctx)
		if err != nil {
			t.Fatalf("Receive after Redrive (%d of %d): %v", len(got), len(back), err)
		}
		m := d.Message()
		got[m.ID]++
		if _, ok := m.Headers[driver.CauseHeader]; ok || m.Attempt != 1 || m.Headers[HeaderGroup] != "" || m.Headers["x-test"] != m.ID || m.Key != "k"+m.ID {
			t.Errorf("redriven %s: attempt %d, headers %v, key %q", m.ID, m.Attempt, m.Headers, m.Key)
		}
		if part := driver.MetadataOf(m.Metadata)["messaging.destination.partition.id"]; !strings.HasPrefix(origins[m.ID], topic+"/"+part+"/") {
			t.Errorf("redriven %s to partition %s, consumed from %s", m.ID, part, origins[m.ID])
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	quiet, qcancel := context.WithTimeout(ctx, time.Second)
	if d, err := src.Receive(quiet); err == nil {
		t.Errorf("received %s more than once or unchosen", d.Message().ID)
	}
	qcancel()
	for _, id := range back {
		if got[id] != 1 {
			t.Errorf("%s came back %d times", id, got[id])
		}
	}
	_ = src.Close()

	rest := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return slices.Contains(back, id) })
	for _, dl := range []*DeadLetters{q, openDLQ(t, bs, topic, group)} {
		if left := slices.Sorted(slices.Values(scanIDs(t, dl))); !slices.Equal(left, rest) {
			t.Fatalf("left parked %d, want the %d unchosen", len(left), len(rest))
		}
	}
	if n, err := q.Purge(ctx, func(*driver.Parked) bool { return true }); err != nil || n != len(rest) {
		t.Fatalf("Purge = %d, %v; want %d", n, err, len(rest))
	}
	if left := scanIDs(t, q); len(left) != 0 {
		t.Fatalf("after Purge %d left", len(left))
	}
	parts, err := q.st.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if p.committed != p.end || len(p.handled) != 0 {
			t.Errorf("partition %d: committed %d of %d, handled %v", p.id, p.committed, p.end, p.handled)
		}
	}
}

// Two groups consuming one topic share its dead-letter topic: each
// DeadLetters sees and handles only its group's, and the committed offset
// of its bookkeeping group passes the other group's records.
func TestDeadLettersLeaveOtherGroupsAlone(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	a, b := park(t, bs, topic, "billing", "a", 3), park(t, bs, topic, "audit", "b", 2)
	a = append(a, park(t, bs, topic, "billing", "c", 2)...)
	qa, qb := openDLQ(t, bs, topic, "billing"), openDLQ(t, bs, topic, "audit")
	if got := scanIDs(t, qa); !slices.Equal(got, a) {
		t.Fatalf("billing's dead letters %v, want %v", got, a)
	}
	if n, err := qa.Purge(context.Background(), func(p *driver.Parked) bool { return p.ID != "c-0001" }); err != nil || n != 4 {
		t.Fatalf("Purge = %d, %v; want 4", n, err)
	}
	if got := scanIDs(t, qa); !slices.Equal(got, []string{"c-0001"}) {
		t.Fatalf("billing's dead letters after Purge %v", got)
	}
	if got := scanIDs(t, qb); !slices.Equal(got, b) {
		t.Fatalf("audit's dead letters %v, want %v", got, b)
	}
	parts, err := qa.st.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p := parts[0]; p.committed != 6 || len(p.handled) != 0 {
		t.Errorf("billing's bookkeeping: committed %d, handled %v; want 6 (past audit's), none", p.committed, p.handled)
	}
}

// Records handled out of order are kept as ranges in the commit
// metadata; once they would not fit, Purge stops with
// ErrDeadLettersFragmented, having recorded what it counted, Redrive
// refuses before producing anything, and handling the oldest ones lets it
// go on.
func TestDeadLettersFragmented(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	ids := park(t, bs, topic, "g", "m", 3000)
	q := openDLQ(t, bs, topic, "g")
	odd := func(p *driver.Parked) bool { n, _ := strconv.Atoi(p.ID[2:]); return n%2 == 1 }
	n, err := q.Purge(context.Background(), odd)
	if !errors.Is(err, ErrDeadLettersFragmented) || n == 0 || n >= 1500 {
		t.Fatalf("Purge of every other one = %d, %v; want some, then ErrDeadLettersFragmented", n, err)
	}
	t.Logf("%d purged: %v", n, err)
	if left := scanIDs(t, q); len(left) != len(ids)-n {
		t.Fatalf("%d left after purging %d of %d", len(left), n, len(ids))
	}
	// Redrive checks before it produces: the one it cannot record stays
	// parked and is not sent.
	if r, err := q.Redrive(context.Background(), odd, nil); !errors.Is(err, ErrDeadLettersFragmented) || r != 0 {
		t.Fatalf("Redrive of the next odd one = %d, %v; want 0, ErrDeadLettersFragmented", r, err)
	}
	if sent := readAll(t, bs, topic); len(sent) != 0 {
		t.Fatalf("Redrive sent %d records it could not record as handled", len(sent))
	}
	all, err := q.Purge(context.Background(), func(*driver.Parked) bool { return true })
	if err != nil || all != len(ids)-n {
		t.Fatalf("Purge of the rest = %d, %v; want %d", all, err, len(ids)-n)
	}
}

// Scan, Redrive and Purge work on what was parked when they began, while
// more dead letters keep arriving.
func TestDeadLettersBoundedWhileParking(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	park(t, bs, topic, "g", "old", 5)
	q := openDLQ(t, bs, topic, "g")
	calls := 0
	more := func() { calls++; park(t, bs, topic, "g", fmt.Sprintf("new%d", calls), 1) }
	if err := q.Scan(context.Background(), func(*driver.Parked) error { more(); return nil }); err != nil || calls != 5 {
		t.Fatalf("Scan: %d calls, %v; want 5", calls, err)
	}
	n, err := q.Purge(context.Background(), func(p *driver.Parked) bool { more(); return strings.HasPrefix(p.ID, "old") })
	if err != nil || n != 5 || calls != 15 {
		t.Fatalf("Purge = %d, %v, sel called %d times; want 5, nil, 10", n, err, calls-5)
	}
	if got := scanIDs(t, q); len(got) != 15 {
		t.Fatalf("parked %v, want the 15 new ones", got)
	}
}

// The URL is read as the Source reads it: an unknown parameter is refused
// by name, and dead_letter_group names the bookkeeping group.
func TestDeadLettersURL(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	_, err := admin.OpenDeadLetters(context.Background(), fmt.Sprintf("kafka://%s/%s?group=g&bogus=1", bs, topic))
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown parameter: %v", err)
	}
	if _, err := admin.OpenDeadLetters(context.Background(), fmt.Sprintf("kafka://%s/%s", bs, topic)); err == nil || !strings.Contains(err.Error(), "group") {
		t.Fatalf("no group: %v", err)
	}
	dq, err := admin.OpenDeadLetters(context.Background(), fmt.Sprintf("kafka://%s/%s?group=g&dead_letter_group=ops", bs, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer dq.Close()
	if q := dq.(*DeadLetters); q.Group() != "ops" || q.Name() != topic+".dlq" {
		t.Fatalf("group %q, name %q", q.Group(), q.Name())
	}
	// A dead-letter topic that does not exist yet holds nothing.
	q := openDLQ(t, bs, topic, "g", WithDeadLetterTopic(topic+".nothing-yet"))
	if got := scanIDs(t, q); len(got) != 0 {
		t.Fatalf("parked %v in a missing topic", got)
	}
}

func TestAddSpan(t *testing.T) {
	var spans []span
	for _, o := range []int64{5, 7, 6, 1, 2, 9, 6} {
		spans = addSpan(spans, o)
	}
	if want := []span{{1, 2}, {5, 3}, {9, 1}}; !slices.Equal(spans, want) {
		t.Fatalf("spans %v, want %v", spans, want)
	}
	if got, want := dropBelow(spans, 6), []span{{6, 2}, {9, 1}}; !slices.Equal(got, want) {
		t.Fatalf("dropBelow 6: %v, want %v", got, want)
	}
}
