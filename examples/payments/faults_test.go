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

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/netfault"
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
	// messages are published in all (20% of them duplicates): a quarter
	// before the service starts, then rate a second while the faults run,
	// then what is left.
	messages, rate     int
	batch, concurrency int
	flags              []string // more service flags
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
	began      time.Time
	recoveries []time.Duration
}

// flowing waits until the service is charging: the fault that follows
// lands mid-stream.
func (f *faulted) flowing() {
	f.t.Helper()
	from := f.rows()
	deadline := time.Now().Add(3 * time.Minute)
	for f.rows() < from+20 {
		if time.Now().After(deadline) {
			f.t.Fatalf("no charges for 3m before a fault (%d ledger rows)", f.rows())
		}
		time.Sleep(10 * time.Millisecond)
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
// fault's recovery time (traffic keeps coming, so there is always a next
// one).
func (f *faulted) lifted(what string) {
	f.t.Helper()
	at, from := time.Now(), f.rows()
	for f.rows() == from {
		if time.Since(at) > 3*time.Minute {
			f.t.Fatalf("%s lifted: no charge in 3m (%d ledger rows); the service did not recover by itself", what, from)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := time.Since(at)
	f.recoveries = append(f.recoveries, r)
	f.t.Logf("%s lifted: next charge after %v", what, r.Round(time.Millisecond))
}

// feed is what a scenario published: chunks of payments with seeds of
// their own (so their ids differ), 20% duplicates within each.
type feed struct {
	t       *testing.T
	pub     *core.Publisher
	seed    uint64
	chunks  uint64
	sent    int
	unique  []sent
	retries int // publishes repeated after an error
}

// add publishes n more messages. A publish that fails (through a fault)
// is repeated, whole, as a producer would: what already landed is then
// published twice, which the consumer must apply once.
func (fd *feed) add(n int) {
	fd.t.Helper()
	if n <= 0 {
		return
	}
	sends, unique := traffic(fd.seed+fd.chunks, n, 0.2, 50)
	fd.chunks++
	for began := time.Now(); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := publishSends(ctx, fd.pub, sends, false)
		cancel()
		if err == nil {
			break
		}
		if time.Since(began) > 3*time.Minute {
			fd.t.Errorf("publishing %d payments: %v", n, err)
			return
		}
		fd.retries++
		time.Sleep(500 * time.Millisecond)
	}
	fd.sent += n
	fd.unique = append(fd.unique, unique...)
}

var stopLine = regexp.MustCompile(`msg="payments: stopped" (.*)`)

// runFaulted publishes r.messages payments, consumes them with one
// service process under r.faults (never restarted), stops it with
// SIGTERM, and checks the outcome.
func runFaulted(t *testing.T, r faultRun) {
	bin := serviceBinary(t)
	began := time.Now()
	ctx := context.Background()
	// Opening the source declares what the broker needs before anything is
	// published.
	src, err := core.OpenSource(ctx, r.publish)
	if err != nil {
		t.Fatalf("opening %s: %v", core.Redact(r.publish), err)
	}
	src.Close()
	pub, err := core.OpenPublisher(ctx, r.publish)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	fd := &feed{t: t, pub: pub, seed: uint64(time.Now().UnixNano() % (1 << 30))}
	fd.add(r.messages / 4)
	t.Logf("seed %d: %d payments published before the start", fd.seed, fd.sent)

	logPath := filepath.Join(t.TempDir(), "service.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--broker", r.broker, "--store", r.store, "--tables", r.tables, "--consumer", "payments",
		"--batch", fmt.Sprint(r.batch), "--concurrency", fmt.Sprint(r.concurrency), "--log-level", "info"}, r.flags...)
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
	rows := func() int {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the service ended by itself (%v) under the faults:\n%s", err, tail())
		default:
		}
		n, err := r.ledger.rows(ctx)
		if err != nil {
			return 0 // the tables may not exist yet
		}
		return n
	}

	// The feed: rate payments a second while the faults run.
	stopFeed := make(chan struct{})
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for fd.sent < r.messages {
			select {
			case <-stopFeed:
				return
			case <-tick.C:
			}
			fd.add(min(r.rate/4, r.messages-fd.sent))
		}
	}()
	f := &faulted{t: t, rows: rows, began: began}
	r.faults(t, f)
	close(stopFeed)
	<-fed
	fd.add(r.messages - fd.sent)
	want := map[string]int64{}
	for _, p := range fd.unique {
		want[p.Account] += p.AmountCents
	}
	t.Logf("%d payments published, %d unique; %d publishes repeated after an error", fd.sent, len(fd.unique), fd.retries)

	deadline := time.Now().Add(5 * time.Minute)
	for rows() < len(fd.unique) {
		if time.Now().After(deadline) {
			t.Fatalf("after the faults, %d of %d unique ids in the ledger in 5m:\n%s", rows(), len(fd.unique), tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("all %d unique ids in the ledger at %v", len(fd.unique), time.Since(began).Round(time.Millisecond))
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
	lost, doubled := checkLedger(t, r.ledger, fd.unique, want)
	if r.settled != nil {
		r.settled(t)
	}
	var worst time.Duration
	for _, d := range f.recoveries {
		worst = max(worst, d)
	}
	t.Logf("FAULT-MATRIX | %s | %s | %s | messages=%d lost=%d doubled=%d recovery=%v retried=%s store_outages=%s store_retries=%s total=%v",
		r.scenario, r.brokerName, r.storeName, fd.sent, lost, doubled, worst.Round(10*time.Millisecond),
		stats["retried"], stats["store_outages"], stats["store_retries"], time.Since(began).Round(time.Second))
}

// proxiedURL returns raw with its host:port replaced by p's.
func proxiedURL(t *testing.T, raw string, p *netfault.Proxy) string {
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
func outage(f *faulted, p *netfault.Proxy, what string, d time.Duration) {
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
	tp := netfault.Start(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	q := amqpQueue(t, amqpU)
	broker := withQuery(amqpU, "queue", q, "queue_type", "quorum", "delivery_limit", "5")
	runFaulted(t, faultRun{
		scenario: "database down 30s", brokerName: "rabbitmq (quorum, delivery_limit=5)", storeName: "postgres",
		publish: broker, broker: broker, store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 20000, rate: 300, batch: 20, concurrency: 2,
		faults: func(t *testing.T, f *faulted) {
			f.flowing()
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
	endpoint := servicetest.SQSEndpoint(t)
	store, prefix, l := postgresStore(t)
	tp := netfault.Start(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
	cl := servicetest.SQSClient(endpoint)
	redrive(t, cl, queue, dlq, 5)
	broker := "sqs://test:test@" + queue + "?" + url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dead_letter_mode": {"redrive"}, "visibility": {"10s"}, "wait": {"1s"},
	}.Encode()
	runFaulted(t, faultRun{
		scenario: "database down 30s", brokerName: "sqs (fauxqs, redrive maxReceiveCount=5)", storeName: "postgres",
		publish: broker, broker: broker, store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 6000, rate: 100, batch: 10, concurrency: 2,
		faults: func(t *testing.T, f *faulted) {
			f.flowing()
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

// spell is one network fault, held for a while.
type spell struct {
	name, toxic string
	attrs       netfault.Attributes
	hold        time.Duration
}

// spells are the network faults each path goes through in turn.
var spells = []spell{
	{"latency 150±100ms", "latency", netfault.Attributes{"latency": 150, "jitter": 100}, 4 * time.Second},
	{"a 16 KB/s link", "bandwidth", netfault.Attributes{"rate": 16}, 4 * time.Second},
	{"connections reset", "reset_peer", netfault.Attributes{"timeout": 200}, 2 * time.Second},
	{"half-open (data swallowed)", "timeout", netfault.Attributes{"timeout": 0}, 8 * time.Second},
}

// flaky puts every spell in turn on one direction of p (stream
// "downstream": what the service receives; "upstream": what it sends),
// each once charges flow, and waits after each for the next charge.
func flaky(f *faulted, p *netfault.Proxy, path, stream string) {
	f.t.Helper()
	for _, s := range spells {
		f.flowing()
		what := fmt.Sprintf("%s: %s", path, s.name)
		if err := p.AddToxic(s.toxic, s.toxic, stream, s.attrs); err != nil {
			f.t.Fatalf("%s: %v", what, err)
		}
		f.hold(what, s.hold)
		if err := p.RemoveToxic(s.toxic); err != nil {
			f.t.Fatalf("%s: removing the toxic: %v", what, err)
		}
		f.lifted(what)
	}
}

// The network between the service and RabbitMQ, then Postgres, delays,
// throttles, resets and swallows traffic in turn: on the consume path
// (deliveries), the ack path (acks and heartbeats to the broker) and the
// database path.
func TestFaultFlakyNetworkRabbitMQPostgres(t *testing.T) {
	amqpU := amqpURL(t)
	store, prefix, l := postgresStore(t)
	tp := netfault.Start(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	mq := tp.Proxy(t, "rabbitmq", hostPort(t, amqpU, "5672"))
	q := amqpQueue(t, amqpU)
	// A short heartbeat: a half-open connection is found in seconds.
	params := []string{"queue", q, "queue_type", "quorum", "delivery_limit", "5"}
	runFaulted(t, faultRun{
		scenario:   "flaky network: latency, 16 KB/s, resets, half-open; consume, ack and DB paths in turn",
		brokerName: "rabbitmq (quorum, delivery_limit=5, heartbeat=2s)", storeName: "postgres",
		publish: withQuery(amqpU, params...), broker: withQuery(proxiedURL(t, amqpU, mq), append(params, "heartbeat", "2")...),
		store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 20000, rate: 200, batch: 20, concurrency: 2,
		flags: []string{"--txn-timeout", "3s"},
		faults: func(t *testing.T, f *faulted) {
			flaky(f, mq, "consume path", "downstream")
			flaky(f, mq, "ack path", "upstream")
			flaky(f, pg, "database path", "downstream")
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

// The same faults between the service and the SQS emulator, then MariaDB.
func TestFaultFlakyNetworkSQSMariaDB(t *testing.T) {
	endpoint := servicetest.SQSEndpoint(t)
	store, prefix, l := mysqlStore(t)
	tp := netfault.Start(t)
	db := tp.Proxy(t, "mariadb", hostPort(t, store, "3306"))
	sq := tp.Proxy(t, "sqs", hostPort(t, endpoint, "80"))
	queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
	cl := servicetest.SQSClient(endpoint)
	redrive(t, cl, queue, dlq, 5)
	sqsURL := func(ep string) string {
		return "sqs://test:test@" + queue + "?" + url.Values{
			"endpoint": {ep}, "region": {"us-east-1"}, "dead_letter_mode": {"redrive"}, "visibility": {"10s"}, "wait": {"1s"},
		}.Encode()
	}
	runFaulted(t, faultRun{
		scenario:   "flaky network: latency, 16 KB/s, resets, half-open; consume, ack and DB paths in turn",
		brokerName: "sqs (fauxqs, redrive maxReceiveCount=5)", storeName: "mariadb",
		publish: sqsURL(endpoint), broker: sqsURL(proxiedURL(t, endpoint, sq)),
		store: proxiedURL(t, store, db), tables: prefix, ledger: l,
		messages: 8000, rate: 100, batch: 10, concurrency: 2,
		flags: []string{"--txn-timeout", "3s"},
		faults: func(t *testing.T, f *faulted) {
			flaky(f, sq, "consume path", "downstream")
			flaky(f, sq, "ack path", "upstream")
			flaky(f, db, "database path", "downstream")
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

// The same faults between the service and Kafka (kfake, advertising the
// proxy's address so that every connection goes through it), then
// Postgres. The feed publishes through the faults too, repeating what
// failed.
func TestFaultFlakyNetworkKafkaPostgres(t *testing.T) {
	store, prefix, l := postgresStore(t)
	tp := netfault.Start(t)
	pg := tp.Proxy(t, "postgres", hostPort(t, store, "5432"))
	kport, pport := fmt.Sprint(servicetest.FreePort(t)), fmt.Sprint(servicetest.FreePort(t))
	kf := tp.ProxyAt(t, "kafka", "127.0.0.1:"+pport, "127.0.0.1:"+kport)
	topic := "payments-" + randomHex(4)
	addrs := servicetest.StartKfake(t, "-addr", "127.0.0.1:"+kport, "-advertise", kf.Listen, "-brokers", "1",
		"-auto-create=false", "-topics", topic+":3,"+topic+".dlq:1")
	broker := "kafka://" + addrs + "/" + topic + "?group=payments-" + randomHex(3) + "&session_timeout=6s&heartbeat_interval=1s"
	runFaulted(t, faultRun{
		scenario:   "flaky network: latency, 16 KB/s, resets, half-open; consume, ack and DB paths in turn",
		brokerName: "kafka (kfake, acks=all)", storeName: "postgres",
		publish: broker, broker: broker, store: proxiedURL(t, store, pg), tables: prefix, ledger: l,
		messages: 20000, rate: 200, batch: 20, concurrency: 2,
		flags: []string{"--txn-timeout", "3s"},
		faults: func(t *testing.T, f *faulted) {
			flaky(f, kf, "consume path", "downstream")
			flaky(f, kf, "ack path", "upstream")
			flaky(f, pg, "database path", "downstream")
		},
	})
}
