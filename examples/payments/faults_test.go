//go:build faults

package main

// The fault scenarios: the service consumes real traffic while the test
// takes its database away or corrupts the network between it and its
// broker and database (Toxiproxy in this process, in front of the real
// services), and never restarts it. Each scenario checks the ledger (each
// id charged once, balances exact), that the broker holds nothing at the
// end and parked nothing, and logs one FAULT-MATRIX line with what it
// measured. Run by .ci/faults:
//
//	go test -race -tags faults -run '^TestFault' ./examples/payments/

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	toxiclient "github.com/Shopify/toxiproxy/v2/client"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/servicetest"
)

// faultRun is one scenario.
type faultRun struct {
	scenario, brokerName, storeName string // its FAULT-MATRIX row
	// publish is the broker URL the traffic goes to, straight; broker and
	// store are what the service consumes from and writes to, through the
	// faults.
	publish, broker, store, tables string
	ledger                         ledgerDB
	messages                       int
	batch, concurrency             int
	flags                          []string // more service flags
	// faults runs the schedule while the service consumes; it returns once
	// the last fault is lifted.
	faults func(t *testing.T, f *faulted)
	// settled checks, after the graceful stop, that the broker holds
	// nothing and parked nothing.
	settled func(t *testing.T)
}

// faulted is a running scenario, for its fault schedule.
type faulted struct {
	t          *testing.T
	rows       func() int
	total      int
	began      time.Time
	recoveries []time.Duration
}

// after waits until the ledger holds frac of the unique ids, so that each
// fault lands mid-stream.
func (f *faulted) after(frac float64) {
	f.t.Helper()
	target := int(frac * float64(f.total))
	deadline := time.Now().Add(3 * time.Minute)
	for f.rows() < target {
		if time.Now().After(deadline) {
			f.t.Fatalf("the ledger did not reach %d of %d rows in 3m (at %d)", target, f.total, f.rows())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := f.rows(); n >= f.total {
		f.t.Fatalf("everything was consumed before the fault (%d rows): make the run bigger", n)
	}
}

// hold keeps a fault on for d, logging the ledger's progress under it.
func (f *faulted) hold(what string, d time.Duration) {
	before := f.rows()
	time.Sleep(d)
	f.t.Logf("%s for %v: %d → %d ledger rows (at %v)", what, d, before, f.rows(), time.Since(f.began).Round(time.Millisecond))
}

// lifted records that a fault was just lifted and waits for the next
// committed effect: the service recovered by itself. The wait is the
// fault's recovery time.
func (f *faulted) lifted(what string) {
	f.t.Helper()
	at, from := time.Now(), f.rows()
	for f.rows() == from && from < f.total {
		if time.Since(at) > 3*time.Minute {
			f.t.Fatalf("%s lifted: no progress in 3m (%d of %d rows); the service did not recover by itself", what, from, f.total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := time.Since(at)
	f.recoveries = append(f.recoveries, r)
	f.t.Logf("%s lifted: next charge after %v", what, r.Round(time.Millisecond))
}

var stopLine = regexp.MustCompile(`msg="payments: stopped" (.*)`)

// runFaulted publishes r.messages payments (20% duplicates), consumes them
// with one service process under r.faults, stops it with SIGTERM, and
// checks the outcome.
func runFaulted(t *testing.T, r faultRun) {
	bin := serviceBinary(t)
	began := time.Now()
	seed := uint64(time.Now().UnixNano() % (1 << 30))
	const dup = 0.2
	_, unique := traffic(seed, r.messages, dup, 50)
	want := map[string]int64{}
	for _, p := range unique {
		want[p.Account] += p.AmountCents
	}
	out, err := exec.Command(bin, "--broker", r.publish, "--publish", fmt.Sprint(r.messages),
		"--duplicates", fmt.Sprint(dup), "--seed", fmt.Sprint(seed)).CombinedOutput()
	if err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	t.Logf("seed %d: %s (%v)", seed, bytes.TrimSpace(out), time.Since(began).Round(time.Millisecond))

	logPath := filepath.Join(t.TempDir(), "service.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--broker", r.broker, "--store", r.store, "--tables", r.tables, "--consumer", "payments",
		"--batch", fmt.Sprint(r.batch), "--concurrency", fmt.Sprint(r.concurrency), "--log-level", "warn"}, r.flags...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	}()
	tail := func() string {
		b, _ := os.ReadFile(logPath)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return strings.Join(lines[max(0, len(lines)-25):], "\n")
	}
	ctx := context.Background()
	rows := func() int {
		select {
		case err := <-exited:
			t.Fatalf("the service ended by itself (%v) under the faults:\n%s", err, tail())
		default:
		}
		n, err := r.ledger.rows(ctx)
		if err != nil {
			return 0 // the tables may not exist yet
		}
		return n
	}
	f := &faulted{t: t, rows: rows, total: len(unique), began: began}
	r.faults(t, f)

	deadline := time.Now().Add(5 * time.Minute)
	for rows() < len(unique) {
		if time.Now().After(deadline) {
			t.Fatalf("after the faults, %d of %d unique ids in the ledger in 5m:\n%s", rows(), len(unique), tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("all %d unique ids in the ledger at %v", len(unique), time.Since(began).Round(time.Millisecond))
	time.Sleep(time.Second) // a late double charge gets its chance to land
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the service did not stop cleanly on SIGTERM: %v\n%s", err, tail())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("the service did not stop within 60s of SIGTERM:\n%s", tail())
	}
	log, _ := os.ReadFile(logPath)
	stop := stopLine.FindSubmatch(log)
	if stop == nil {
		t.Fatalf("the service's log has no stop line:\n%s", tail())
	}
	stats := map[string]string{}
	for _, kv := range strings.Fields(string(stop[1])) {
		k, v, _ := strings.Cut(kv, "=")
		stats[k] = v
	}
	if stats["dead_lettered"] != "0" {
		t.Errorf("the service parked %s messages: every payment is valid", stats["dead_lettered"])
	}
	lost, doubled := checkLedger(t, r.ledger, unique, want)
	if r.settled != nil {
		r.settled(t)
	}
	var worst time.Duration
	for _, d := range f.recoveries {
		worst = max(worst, d)
	}
	t.Logf("FAULT-MATRIX | %s | %s | %s | messages=%d lost=%d doubled=%d recovery=%v retried=%s store_outages=%s store_retries=%s total=%v",
		r.scenario, r.brokerName, r.storeName, r.messages, lost, doubled, worst.Round(10*time.Millisecond),
		stats["retried"], stats["store_outages"], stats["store_retries"], time.Since(began).Round(time.Second))
}

// proxiedURL returns raw with its host:port replaced by p's.
func proxiedURL(t *testing.T, raw string, p *toxiclient.Proxy) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Listen
	return u.String()
}

// hostPort returns raw's host:port, with def as the port when it has none.
func hostPort(t *testing.T, raw, def string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), def)
	}
	return u.Host
}

// outage takes the link down (connections refused, open ones cut) for d.
func outage(f *faulted, p *toxiclient.Proxy, what string, d time.Duration) {
	f.t.Helper()
	if err := p.Disable(); err != nil {
		f.t.Fatal(err)
	}
	f.hold(what+" down", d)
	if err := p.Enable(); err != nil {
		f.t.Fatal(err)
	}
	f.lifted(what + " outage")
}

// A 30 s database outage under a RabbitMQ quorum queue with
// delivery_limit=5 parks nothing: the Consumer holds its messages while
// the database is away instead of handing them back, which would spend a
// delivery each time.
func TestFaultDatabaseOutageQuorumQueue(t *testing.T) {
	amqpU := amqpURL(t)
	store, prefix, l := postgresStore(t)
	tp := servicetest.StartToxiproxy(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	q := amqpQueue(t, amqpU)
	broker := withQuery(amqpU, "queue", q, "queue_type", "quorum", "delivery_limit", "5")
	runFaulted(t, faultRun{
		scenario: "database down 30s", brokerName: "rabbitmq (quorum, delivery_limit=5)", storeName: "postgres",
		publish: broker, broker: broker, store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 10000, batch: 20, concurrency: 2,
		faults: func(t *testing.T, f *faulted) {
			f.after(0.2)
			outage(f, pg, "postgres", 30*time.Second)
		},
		settled: func(t *testing.T) {
			for _, name := range []string{q, q + ".dlq"} {
				if n := amqpDepth(t, amqpU, name); n != 0 {
					t.Errorf("queue %s holds %d messages after the graceful stop", name, n)
				}
			}
		},
	})
}

// A 30 s database outage under an SQS queue whose redrive policy parks a
// message after 5 receives parks nothing.
func TestFaultDatabaseOutageSQSRedrive(t *testing.T) {
	endpoint := sqsEndpoint(t)
	store, prefix, l := postgresStore(t)
	tp := servicetest.StartToxiproxy(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	queue, dlq := sqsQueues(t, endpoint)
	cl := sqsClient(endpoint)
	redrive(t, cl, queue, dlq, 5)
	broker := "sqs://test:test@" + queue + "?" + url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dead_letter_mode": {"redrive"}, "visibility": {"10s"}, "wait": {"1s"},
	}.Encode()
	runFaulted(t, faultRun{
		scenario: "database down 30s", brokerName: "sqs (fauxqs, redrive maxReceiveCount=5)", storeName: "postgres",
		publish: broker, broker: broker, store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 5000, batch: 10, concurrency: 2,
		faults: func(t *testing.T, f *faulted) {
			f.after(0.2)
			outage(f, pg, "postgres", 30*time.Second)
		},
		settled: func(t *testing.T) {
			for _, name := range []string{queue, dlq} {
				if n := sqsDepth(t, cl, name); n != 0 {
					t.Errorf("SQS queue %s holds %d messages after the graceful stop", name, n)
				}
			}
		},
	})
}

func sqsClient(endpoint string) *awssqs.Client {
	return awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// redrive gives queue a redrive policy: after maxReceives receives SQS
// moves a message to dlq.
func redrive(t *testing.T, cl *awssqs.Client, queue, dlq string, maxReceives int) {
	t.Helper()
	ctx := context.Background()
	qURL, dURL := sqsQueueURL(t, cl, queue), sqsQueueURL(t, cl, dlq)
	attrs, err := cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: &dURL,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	policy, _ := json.Marshal(map[string]string{
		"deadLetterTargetArn": attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)],
		"maxReceiveCount":     fmt.Sprint(maxReceives),
	})
	if _, err := cl.SetQueueAttributes(ctx, &awssqs.SetQueueAttributesInput{QueueUrl: &qURL,
		Attributes: map[string]string{string(sqstypes.QueueAttributeNameRedrivePolicy): string(policy)}}); err != nil {
		t.Fatalf("redrive policy on %s: %v", queue, err)
	}
}

func sqsQueueURL(t *testing.T, cl *awssqs.Client, name string) string {
	t.Helper()
	out, err := cl.GetQueueUrl(context.Background(), &awssqs.GetQueueUrlInput{QueueName: &name})
	if err != nil {
		t.Fatal(err)
	}
	return *out.QueueUrl
}

// sqsDepth returns the messages visible and in flight in queue name.
func sqsDepth(t *testing.T, cl *awssqs.Client, name string) int {
	t.Helper()
	u := sqsQueueURL(t, cl, name)
	out, err := cl.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{QueueUrl: &u,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, a := range []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
		sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible} {
		var v int
		fmt.Sscan(out.Attributes[string(a)], &v)
		n += v
	}
	return n
}
