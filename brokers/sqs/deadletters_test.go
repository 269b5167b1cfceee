package sqs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// openDLQ opens the dead-letter queue of q's consumer with opts.
func openDLQ(t *testing.T, ep string, q testQueue, opts ...Option) *DeadLetters {
	t.Helper()
	d, err := OpenDeadLetters(context.Background(), q.addr(), append(clientOpts(ep), append([]Option{WithLogger(testLogger(t))}, opts...)...)...)
	if err != nil {
		t.Fatalf("OpenDeadLetters: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// scanIDs returns the ids of the parked messages, failing on one listed
// twice.
func scanIDs(t *testing.T, d *DeadLetters) map[string]*admin.Parked {
	t.Helper()
	out := map[string]*admin.Parked{}
	err := d.Scan(context.Background(), func(p *admin.Parked) error {
		if _, dup := out[p.ID]; dup {
			return fmt.Errorf("%s listed twice", p.ID)
		}
		out[p.ID] = p
		return nil
	})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// parkCopies sends copies of ms to the dead-letter queue as DeadLetterSend
// makes them (cause, source queue, attempt), ten per SendMessageBatch.
func parkCopies(t *testing.T, ep string, dlq testQueue, from string, ms []*driver.Message) {
	t.Helper()
	cl := testClient(ep)
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	for start := 0; start < len(ms); start += 10 {
		var entries []types.SendMessageBatchRequestEntry
		for i, m := range ms[start:min(start+10, len(ms))] {
			entries = append(entries, types.SendMessageBatchRequestEntry{
				Id:          aws.String(fmt.Sprint(i)),
				MessageBody: aws.String(string(m.Body)),
				MessageAttributes: map[string]types.MessageAttributeValue{
					DefaultIDAttribute:   str(m.ID),
					driver.CauseHeader:   str("bad deploy " + m.ID),
					driver.OriginHeader:  str(from),
					driver.AttemptHeader: str("3"),
				},
			})
		}
		out, err := cl.SendMessageBatch(context.Background(), &awssqs.SendMessageBatchInput{QueueUrl: aws.String(dlq.url), Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			t.Fatalf("SendMessageBatch: %v %v", err, out)
		}
	}
}

// TestDeadLettersBeyondOneReceive parks 250 messages, far more than one
// receive brings: Scan lists each once and leaves them all visible;
// Redrive puts back exactly the 100 chosen by id, once each, without the
// dead-letter attributes; Purge deletes the other 150.
func TestDeadLettersBeyondOneReceive(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	ms := msgs("big", 250)
	parkCopies(t, ep, dlq, q.name, ms)
	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	if d.Name() != dlq.name {
		t.Errorf("Name() = %q, want %q", d.Name(), dlq.name)
	}

	parked := scanIDs(t, d)
	if len(parked) != len(ms) {
		t.Fatalf("Scan listed %d, want %d", len(parked), len(ms))
	}
	for _, m := range ms {
		p := parked[m.ID]
		if p == nil {
			t.Fatalf("%s not listed", m.ID)
		}
		if p.Cause != "bad deploy "+m.ID || p.Attempt != 3 || p.Origin != q.name || p.Destination != q.name || string(p.Body) != string(m.Body) || p.ParkedAt.IsZero() || p.Ref == "" {
			t.Fatalf("%s listed as %+v", m.ID, p)
		}
	}
	if visible, inflight := queueCounts(t, ep, dlq.url); visible != len(ms) || inflight != 0 {
		t.Fatalf("after Scan: %d visible, %d in flight; want %d, 0", visible, inflight, len(ms))
	}

	var chosen []string
	for i, m := range ms {
		if i%5 < 2 {
			chosen = append(chosen, m.ID)
		}
	}
	calls := map[string]int{}
	last := 0
	n, err := d.Redrive(context.Background(), func(p *admin.Parked) bool {
		calls[p.ID]++
		return slices.Contains(chosen, p.ID)
	}, func(done int) {
		if done != last+1 {
			t.Errorf("progress %d after %d", done, last)
		}
		last = done
	})
	if err != nil || n != len(chosen) || last != len(chosen) {
		t.Fatalf("Redrive = %d, %v (progress %d); want %d", n, err, last, len(chosen))
	}
	if len(calls) != len(ms) {
		t.Errorf("sel called for %d messages, want %d", len(calls), len(ms))
	}
	for id, c := range calls {
		if c != 1 {
			t.Errorf("sel called %d times for %s", c, id)
		}
	}

	back := drain(t, ep, q.url)
	var got []string
	for _, m := range back {
		got = append(got, attr(m, DefaultIDAttribute))
		for _, k := range deadletter.Bookkeeping {
			if _, ok := m.MessageAttributes[k]; ok {
				t.Errorf("redriven %s still carries %s", attr(m, DefaultIDAttribute), k)
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, chosen) {
		t.Fatalf("redriven %d messages, want the %d chosen: %v", len(got), len(chosen), got)
	}

	left := scanIDs(t, d)
	if len(left) != len(ms)-len(chosen) {
		t.Fatalf("%d still parked, want %d", len(left), len(ms)-len(chosen))
	}
	for _, id := range chosen {
		if left[id] != nil {
			t.Errorf("%s redriven but still parked", id)
		}
	}
	// Purge deletes what each receive brought in one request: first 7,
	// then the rest.
	ops := &opCounter{n: map[string]int{}}
	counted := awssqs.New(testClient(ep).Options(), func(o *awssqs.Options) { o.HTTPClient = &http.Client{Transport: ops} })
	dc := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name), WithClient(counted))
	ids := slices.Sorted(maps.Keys(left))
	if n, err := dc.Purge(context.Background(), func(p *admin.Parked) bool { return slices.Contains(ids[:7], p.ID) }); err != nil || n != 7 {
		t.Fatalf("Purge of 7 = %d, %v", n, err)
	}
	if n, err := dc.Purge(context.Background(), nil); err != nil || n != len(left)-7 {
		t.Fatalf("Purge = %d, %v; want %d", n, err, len(left)-7)
	}
	if left := scanIDs(t, d); len(left) != 0 {
		t.Fatalf("%d still parked after Purge", len(left))
	}
	// One DeleteMessageBatch at most per receive, each of ten at most.
	if batches := ops.get("AmazonSQS.DeleteMessageBatch"); batches > ops.get("AmazonSQS.ReceiveMessage") || batches*10 < len(left) || ops.get("AmazonSQS.DeleteMessage") != 0 {
		t.Fatalf("Purge of %d sent %d DeleteMessageBatch and %d DeleteMessage requests over %d receives", len(left), batches, ops.get("AmazonSQS.DeleteMessage"), ops.get("AmazonSQS.ReceiveMessage"))
	}
}

// opCounter counts the SQS requests it carries by operation.
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.Header.Get("X-Amz-Target")]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// TestDeadLettersLookHidesNothing: while a look is in progress (its
// callback stopped at the first message, as a slow page view or a look
// whose process died there), no parked message is hidden: a second
// operator's list and a show of one message find every one. Right after
// the look, a list and a redrive find them all too.
func TestDeadLettersLookHidesNothing(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	ms := msgs("look", 40)
	parkCopies(t, ep, dlq, q.name, ms)
	first := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	second := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	ctx := context.Background()
	checkAllVisible := func(when string) {
		t.Helper()
		if visible, inflight := queueCounts(t, ep, dlq.url); visible != len(ms) || inflight != 0 {
			t.Errorf("%s: %d visible, %d in flight; want %d, 0", when, visible, inflight, len(ms))
		}
	}

	looking, resume := make(chan struct{}), make(chan struct{})
	looked := make(chan int, 1)
	go func() {
		n := 0
		err := first.Scan(ctx, func(*admin.Parked) error {
			if n++; n == 1 {
				close(looking)
				<-resume
			}
			return nil
		})
		if err != nil {
			t.Errorf("first look: %v", err)
		}
		looked <- n
	}()
	<-looking
	checkAllVisible("during a look")
	listed := scanIDs(t, second)
	if len(listed) != len(ms) {
		t.Errorf("a list during another look found %d, want %d", len(listed), len(ms))
	}
	// A show of one message, as idemq dlq show --ref reads it.
	if p := listed[ms[7].ID]; p != nil {
		var copies []*admin.Parked
		if err := second.Scan(ctx, func(c *admin.Parked) error {
			if c.Ref == p.Ref {
				copies = append(copies, c)
			}
			return nil
		}); err != nil || len(copies) != 1 || copies[0].ID != ms[7].ID {
			t.Errorf("show of ref %s during another look = %d copies, %v", p.Ref, len(copies), err)
		}
	}
	checkAllVisible("after a list and a show during a look")
	close(resume)
	if n := <-looked; n != len(ms) {
		t.Errorf("the first look listed %d, want %d", n, len(ms))
	}

	checkAllVisible("right after the looks")
	if listed := scanIDs(t, second); len(listed) != len(ms) {
		t.Errorf("a list right after the looks found %d, want %d", len(listed), len(ms))
	}
	if n, err := first.Redrive(ctx, nil, nil); err != nil || n != len(ms) {
		t.Fatalf("Redrive right after the looks = %d, %v; want %d", n, err, len(ms))
	}
	back := map[string]int{}
	for _, m := range drain(t, ep, q.url) {
		back[attr(m, DefaultIDAttribute)]++
	}
	for _, m := range ms {
		if back[m.ID] != 1 {
			t.Errorf("%s redriven %d times, want once", m.ID, back[m.ID])
		}
	}
}

// TestDeadLettersLookFIFOGroups: SQS may hand a look the messages it made
// visible again before any others (a FIFO queue hands out the same head of
// each group, ten groups a receive); the look then holds what it receives,
// so that the next receives reach the other groups, and releases them when
// it returns.
func TestDeadLettersLookFIFOGroups(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, true, 5, 0)
	const groups, each = 12, 2 // more groups than one receive brings
	cl := testClient(ep)
	for g := range groups {
		for i := range each {
			id := fmt.Sprintf("g%02d-%d", g, i)
			if _, err := cl.SendMessage(context.Background(), &awssqs.SendMessageInput{QueueUrl: aws.String(dlq.url), MessageBody: aws.String(id),
				MessageGroupId: aws.String(fmt.Sprint("group-", g)), MessageDeduplicationId: aws.String(id),
				MessageAttributes: map[string]types.MessageAttributeValue{DefaultIDAttribute: stringAttr(id), driver.CauseHeader: stringAttr("bad")}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	listed := map[string]int{}
	for _, p := range scanIDs(t, d) {
		listed[p.Key]++
	}
	if len(listed) != groups {
		t.Errorf("a look listed messages of %d groups, want all %d: %v", len(listed), groups, listed)
	}
	if visible, inflight := queueCounts(t, ep, dlq.url); visible != groups*each || inflight != 0 {
		t.Errorf("after the look: %d visible, %d in flight; want %d, 0", visible, inflight, groups*each)
	}
}

// TestDeadLettersFoldedAttributes parks a message whose attributes do not
// fit beside the dead-letter ones: Scan shows them unfolded, and Redrive
// sends the original attributes, unfolded, without the bookkeeping.
func TestDeadLettersFoldedAttributes(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	m := msgs("folded", 1)[0]
	m.Headers = map[string]string{}
	for i := range 9 {
		m.Headers[fmt.Sprintf("h%d", i)] = fmt.Sprintf("v%d", i)
	}
	publish(t, ep, q, m)
	s := open(t, ep, q, WithDeadLetterQueue(dlq.name))
	if err := receiveOne(t, receiver(t, s, 0), 10*time.Second).DeadLetter(context.Background(), errors.New("too many headers")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	p := scanIDs(t, d)[m.ID]
	if p == nil {
		t.Fatal("not parked")
	}
	for k, v := range m.Headers {
		if p.Headers[k] != v {
			t.Errorf("Scan: header %s = %q, want %q", k, p.Headers[k], v)
		}
	}
	if _, folded := p.Headers[AttributeFolded]; folded {
		t.Error("Scan shows the folded attribute instead of unfolding it")
	}
	if p.Cause != "too many headers" || p.Attempt != 1 {
		t.Errorf("Cause %q Attempt %d", p.Cause, p.Attempt)
	}
	if n, err := d.Redrive(context.Background(), nil, nil); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := rawReceive(ctx, ep, q.url)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{DefaultIDAttribute: m.ID}
	for k, v := range m.Headers {
		want[k] = v
	}
	if fmt.Sprint(raw.Headers) != fmt.Sprint(want) {
		t.Errorf("redriven attributes %v, want %v", raw.Headers, want)
	}
}

// TestDeadLettersFIFO redrives a FIFO message parked by DeadLetterSend
// within SQS's deduplication window: it comes back with its group, under
// a new deduplication id (the original's would be dropped).
func TestDeadLettersFIFO(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, true, 5, 0)
	m := msgs("fifo", 1)[0]
	m.Key = "customer-7"
	publish(t, ep, q, m)
	r := receiver(t, open(t, ep, q, WithDeadLetterQueue(dlq.name)), 0)
	if err := receiveOne(t, r, 10*time.Second).DeadLetter(context.Background(), errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	if p := scanIDs(t, d)[m.ID]; p == nil || p.Key != m.Key {
		t.Fatalf("parked %+v, want key %q", p, m.Key)
	}
	if n, err := d.Redrive(context.Background(), nil, nil); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	got := receiveOne(t, r, 10*time.Second).Message()
	if got.ID != m.ID || got.Key != m.Key || got.Attempt != 1 {
		t.Errorf("redriven %s key %q attempt %d, want %s %q 1", got.ID, got.Key, got.Attempt, m.ID, m.Key)
	}
}

// TestDeadLettersRedrivePolicyFallback redrives every message the redrive
// policy moved. That is where Redrive asks for a message move task; fauxqs
// has none, so it falls back to sending and deleting each one, and the
// result must be the same: all back on the queue, the dead-letter queue
// empty.
func TestDeadLettersRedrivePolicyFallback(t *testing.T) {
	ep := sqsEndpoint(t)
	q, _ := newQueueWithDLQ(t, ep, false, 5, 1)
	ms := msgs("moved", 3)
	publish(t, ep, q, ms...)
	cl := testClient(ep)
	d := openDLQ(t, ep, q, WithDeadLetterMode(DeadLetterRedrive))
	// Received once and released, then received again: SQS moves them.
	deadline := time.Now().Add(10 * time.Second)
	for len(scanIDs(t, d)) < len(ms) {
		if time.Now().After(deadline) {
			t.Fatal("SQS did not move the messages")
		}
		out, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(q.url), MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			if _, err := cl.ChangeMessageVisibility(context.Background(), &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(q.url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for id, p := range scanIDs(t, d) {
		if !strings.Contains(p.Cause, "maxReceiveCount (1)") || p.Attempt != 1 || p.Destination != q.name {
			t.Errorf("%s: Cause %q Attempt %d Destination %q", id, p.Cause, p.Attempt, p.Destination)
		}
	}
	_, err := d.s.cl.ListMessageMoveTasks(context.Background(), &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(d.s.dlq.arn)})
	if !unsupported(err) {
		t.Logf("the endpoint supports message move tasks (%v): Redrive uses one", err)
	}
	var progress []int
	n, err := d.Redrive(context.Background(), nil, func(done int) { progress = append(progress, done) })
	if err != nil || n != len(ms) || !slices.Equal(progress, []int{1, 2, 3}) {
		t.Fatalf("Redrive = %d, %v (progress %v); want %d", n, err, progress, len(ms))
	}
	back := map[string]int{}
	for _, m := range drain(t, ep, q.url) {
		back[attr(m, DefaultIDAttribute)]++
	}
	for _, m := range ms {
		if back[m.ID] != 1 {
			t.Errorf("%s back on the queue %d times, want once (all: %v)", m.ID, back[m.ID], back)
		}
	}
	if left := scanIDs(t, d); len(left) != 0 {
		t.Errorf("%d still parked", len(left))
	}
}

// TestDeadLettersSlowCallStaysHidden keeps the messages a Purge holds
// hidden while its selection takes longer than their visibility timeout:
// the heartbeat extends it, the call still offers each message once, and
// those it leaves are visible again when it returns.
func TestDeadLettersSlowCallStaysHidden(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	old := browseVisibility
	browseVisibility = 3 * time.Second
	t.Cleanup(func() { browseVisibility = old })
	ms := msgs("slow", 15)
	parkCopies(t, ep, dlq, q.name, ms)
	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	seen := map[string]int{}
	n, err := d.Purge(context.Background(), func(p *admin.Parked) bool {
		if len(seen) == 0 {
			time.Sleep(2 * browseVisibility)
			// A receive finds only the messages the Purge has not received
			// yet; it makes them visible again at once.
			cl := testClient(ep)
			out, err := cl.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(dlq.url), MaxNumberOfMessages: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.Messages) > len(ms)-10 {
				t.Errorf("a receive during a slow Purge got %d messages, want at most %d (the other 10 kept hidden)", len(out.Messages), len(ms)-10)
			}
			for _, m := range out.Messages {
				if _, err := cl.ChangeMessageVisibility(context.Background(), &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(dlq.url), ReceiptHandle: m.ReceiptHandle}); err != nil {
					t.Fatal(err)
				}
			}
		}
		seen[p.ID]++
		return false
	})
	if err != nil || n != 0 || len(seen) != len(ms) {
		t.Fatalf("Purge choosing none = %d, %v; offered %d of %d", n, err, len(seen), len(ms))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s offered %d times", id, n)
		}
	}
	if visible, inflight := queueCounts(t, ep, dlq.url); visible != len(ms) || inflight != 0 {
		t.Errorf("after Purge: %d visible, %d in flight; want %d, 0", visible, inflight, len(ms))
	}
}

// TestDeadLettersLostReceive hides ten parked messages during a Scan the
// way a receive whose answer was lost on the way does (received, never
// seen by the call): the Scan waits for them to come back instead of
// listing fewer.
func TestDeadLettersLostReceive(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	old := browseVisibility
	// Longer than the empty receives after which a call would give up.
	browseVisibility = 2 * maxEmptyReceives * time.Second
	t.Cleanup(func() { browseVisibility = old })
	ms := msgs("lost", 25)
	parkCopies(t, ep, dlq, q.name, ms)
	d := openDLQ(t, ep, q, WithDeadLetterQueue(dlq.name))
	lost := 0
	seen := map[string]int{}
	err := d.Scan(context.Background(), func(p *admin.Parked) error {
		if len(seen) == 0 {
			out, err := testClient(ep).ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(dlq.url), MaxNumberOfMessages: 10, VisibilityTimeout: int32(browseVisibility / time.Second)})
			if err != nil {
				return err
			}
			lost = len(out.Messages)
		}
		seen[p.ID]++
		return nil
	})
	if err != nil || lost == 0 {
		t.Fatalf("Scan: %v; %d hidden by the lost receive", err, lost)
	}
	if len(seen) != len(ms) {
		t.Fatalf("Scan listed %d, want %d (%d were hidden by a lost receive)", len(seen), len(ms), lost)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s listed %d times", id, n)
		}
	}
}

// TestOpenDeadLettersURL opens the dead-letter queue by the consumer's
// URL, whose parameters are read and checked as the Source's are.
func TestOpenDeadLettersURL(t *testing.T) {
	ep := sqsEndpoint(t)
	q, dlq := newQueueWithDLQ(t, ep, false, 5, 0)
	base := fmt.Sprintf("sqs://test:test@%s?region=us-east-1&endpoint=%s", q.name, url.QueryEscape(ep))
	ctx := context.Background()
	d, err := admin.OpenDeadLetters(ctx, base+"&dlq="+dlq.name+"&wait=1s")
	if err != nil {
		t.Fatalf("OpenDeadLetters: %v", err)
	}
	d.Close()
	if d.Name() != dlq.name {
		t.Errorf("Name() = %q, want %q", d.Name(), dlq.name)
	}
	for raw, want := range map[string]string{
		base + "&dlq=" + dlq.name + "&bogus=1": "bogus",
		base + "&dlq=" + dlq.name + "&wait=x":  "wait",
		base:                                   "dlq",
		base + "&dead_letter_mode=redrive":     "dead_letter_mode",
	} {
		if _, err := admin.OpenDeadLetters(ctx, raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenDeadLetters(…%s): err = %v, want one naming %s", raw[len(base):], err, want)
		}
	}
}
