package console_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/internal/servicetest"

	_ "github.com/idemq/idemq/brokers/kafka"
	_ "github.com/idemq/idemq/brokers/nats"
	_ "github.com/idemq/idemq/brokers/sqs"
)

// The payments service's traffic in these tests: paymentsPublished
// messages, a fifth of them copies of earlier ones, amounts of 1 to 100,000
// cents; the first run dead-letters those above paymentsLimit.
const (
	paymentsPublished = 40
	paymentsLimit     = 50000
)

// rejectGroup is the cause group of the payments the service refuses with
// --reject-above: `idemq: message "ID": handler: permanent: payment ID:
// amount_cents N above the limit L` with its varying parts left out.
const rejectGroup = "idemq: message …: handler: permanent: payment …: amount_cents … above the limit …"

// paymentsBroker is one broker the payments service runs on.
type paymentsBroker struct {
	name string
	// url returns the broker URL for the service and the console, on a
	// fresh queue, topic or stream of t's own.
	url func(t *testing.T) string
}

// TestPaymentsDeadLetters runs the payments service (examples/payments) on
// Kafka (kfake), SQS (fauxqs) and NATS JetStream with an SQLite store and
// --reject-above, so that it dead-letters the larger payments itself; the
// console then shows them on its overview and grouped by their cause,
// redrives the group through its confirmation, and the service, run again
// without the limit, applies each redriven payment exactly once (ledger
// rows counted per id).
func TestPaymentsDeadLetters(t *testing.T) {
	// Built once, by the first subtest whose broker is reachable.
	bin := filepath.Join(t.TempDir(), "payments")
	var (
		build    sync.Once
		buildErr error
	)
	for _, b := range []paymentsBroker{
		{"Kafka", func(t *testing.T) string {
			topic := "payments-" + randomHex(4)
			addrs := servicetest.KafkaTopics(t, 3, topic)
			return "kafka://" + addrs + "/" + topic + "?group=payments-" + randomHex(3)
		}},
		{"SQS", func(t *testing.T) string {
			endpoint := servicetest.SQSEndpoint(t)
			queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
			return "sqs://test:test@" + queue + "?" + url.Values{
				"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "visibility": {"5s"}, "wait": {"1s"},
			}.Encode()
		}},
		{"NATS", func(t *testing.T) string {
			nu := servicetest.NATSURL(t)
			stream := "PAYMENTS_" + strings.ToUpper(randomHex(4))
			servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
			return nu + "/" + stream + "?consumer=payments&subject=" + strings.ToLower(stream)
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			brokerURL := b.url(t)
			build.Do(func() { buildErr = buildPayments(t, bin) })
			if buildErr != nil {
				t.Fatal(buildErr)
			}
			runPaymentsDeadLetters(t, bin, brokerURL)
		})
	}
}

// buildPayments builds the payments service to bin.
func buildPayments(t *testing.T, bin string) error {
	began := time.Now()
	cmd := exec.Command("go", "build", "-o", bin, "github.com/idemq/idemq/examples/payments")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build examples/payments: %v\n%s", err, out)
	}
	t.Logf("built the payments service in %v", time.Since(began).Round(time.Millisecond))
	return nil
}

// paymentsRun is the payments service running as a process of its own.
type paymentsRun struct {
	cmd  *exec.Cmd
	log  *servicetest.Buffer
	done chan error
}

// startPayments starts the service with args.
func startPayments(t *testing.T, bin string, args ...string) *paymentsRun {
	t.Helper()
	r := &paymentsRun{cmd: exec.Command(bin, args...), log: &servicetest.Buffer{}, done: make(chan error, 1)}
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// decisions counts the decisions the run logged by kind: processed,
// duplicate and dead_letter (a retry is not a decision that ends a
// delivery).
func (r *paymentsRun) decisions() (processed, duplicate, deadLettered int) {
	l := r.log.String()
	return strings.Count(l, "decision=processed"), strings.Count(l, "decision=duplicate"), strings.Count(l, "decision=dead_letter")
}

// decided counts the decisions the run logged, and the dead-letter ones
// among them.
func (r *paymentsRun) decided() (n, deadLettered int) {
	p, d, dl := r.decisions()
	return p + d + dl, dl
}

// waitDecided waits until the run logged n decisions, failing t if it exits
// first or takes longer than timeout.
func (r *paymentsRun) waitDecided(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if got, _ := r.decided(); got >= n {
			return
		}
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("the payments service exited (%v) before deciding %d messages:\n%s", err, n, r.log.String())
		case <-deadline:
			got, _ := r.decided()
			t.Fatalf("the payments service decided %d of %d messages in %v:\n%s", got, n, timeout, r.log.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop stops the run with SIGTERM and wants a clean exit.
func (r *paymentsRun) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			t.Fatalf("the payments service did not stop cleanly: %v\n%s", err, r.log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the payments service did not stop within 30s of SIGTERM:\n%s", r.log.String())
	}
}

var publishedUnique = regexp.MustCompile(`published (\d+) messages to .*: (\d+) unique payments`)

// runPaymentsDeadLetters is one broker's run of TestPaymentsDeadLetters.
func runPaymentsDeadLetters(t *testing.T, bin, brokerURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	storeURL := "sqlite://" + filepath.Join(t.TempDir(), "pay.db") + "?retention=24h"

	out, err := exec.Command(bin, "--broker", brokerURL, "--publish", fmt.Sprint(paymentsPublished),
		"--duplicates", "0.2", "--seed", "11").CombinedOutput()
	if err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	m := publishedUnique.FindSubmatch(out)
	if m == nil {
		t.Fatalf("publish said:\n%s", out)
	}
	unique, _ := strconv.Atoi(string(m[2]))
	t.Logf("%s", strings.TrimSpace(string(out)))

	// The first run refuses the payments above the limit: the service
	// dead-letters them itself, as permanent errors.
	run := startPayments(t, bin, "--broker", brokerURL, "--store", storeURL, "--consumer", "payments",
		"--reject-above", fmt.Sprint(paymentsLimit))
	run.waitDecided(t, paymentsPublished, 60*time.Second)
	run.stop(t)
	_, parkedCopies := run.decided()
	if parkedCopies == 0 || parkedCopies == paymentsPublished {
		t.Fatalf("%d of %d messages dead-lettered: the limit splits nothing\n%s", parkedCopies, paymentsPublished, run.log.String())
	}
	t.Logf("first run: %d of %d messages dead-lettered (%v)", parkedCopies, paymentsPublished, time.Since(began).Round(time.Millisecond))

	s, err := admin.OpenStore(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var db *sql.DB
	if !s.As(&db) {
		t.Fatal("the SQLite store hands out no *sql.DB")
	}
	applied := ledgerCounts(t, db)
	dlq, err := admin.OpenDeadLetters(ctx, brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	// What the service parked: one copy per dead-letter decision, every
	// one above the limit, none of them applied.
	parked := map[string]int{}
	if err := dlq.Scan(ctx, func(p *admin.Parked) error {
		parked[p.ID]++
		if !strings.Contains(p.Cause, fmt.Sprintf("above the limit %d", paymentsLimit)) {
			t.Errorf("%s parked with cause %q, want the limit's", p.ID, p.Cause)
		}
		if applied[p.ID] != 0 {
			t.Errorf("%s is parked and in the ledger", p.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := sumCounts(parked); n != parkedCopies {
		t.Fatalf("%d parked copies (%v), want %d, one per dead-letter decision", n, parked, parkedCopies)
	}
	if len(applied)+len(parked) != unique {
		t.Fatalf("%d payments applied and %d parked, want %d unique payments in all", len(applied), len(parked), unique)
	}

	h, err := console.New(console.Config{Store: s, Consumers: []console.Consumer{{Name: "payments", DeadLetters: dlq, SourceURL: brokerURL}}})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)
	servicetest.WaitFor(t, 30*time.Second, "the dead letters on the overview", func() bool {
		_, page := c.do("GET", "", nil, nil)
		return strings.Contains(page, fmt.Sprintf(">%d</a> in %s", parkedCopies, dlq.Name()))
	})
	page := c.get("", fmt.Sprintf(`<p class="estimate">%d claims`, len(applied)))
	if strings.Contains(page, "test:test") {
		t.Errorf("the overview shows credentials:\n%s", page)
	}
	c.get("dlq?consumer=payments", fmt.Sprintf("%d of %d dead letters", parkedCopies, parkedCopies), "1 cause groups",
		fmt.Sprintf(`<span class="count">%d</span> %s`, parkedCopies, rejectGroup))

	// Redrive the group through its confirmation.
	_, action, form := c.confirm("dlq/confirm?consumer=payments&do=redrive&group="+url.QueryEscape(rejectGroup),
		fmt.Sprintf("<strong>%d</strong> dead letters", parkedCopies))
	if action != "dlq/act" || form.Get("token") == "" || form.Get("group") != rejectGroup {
		t.Fatalf("confirmation form: %s %v", action, form)
	}
	c.post(action, form, fmt.Sprintf("redrove %d dead letters of payments", parkedCopies))
	c.get("dlq?consumer=payments", "0 of 0 dead letters")

	// The service again, without the limit: each redriven payment is
	// applied once; a redriven copy of one is a duplicate.
	run = startPayments(t, bin, "--broker", brokerURL, "--store", storeURL, "--consumer", "payments")
	run.waitDecided(t, parkedCopies, 60*time.Second)
	// A moment more for anything beyond the redriven copies to show up.
	time.Sleep(500 * time.Millisecond)
	run.stop(t)
	// One copy of each redriven payment is applied, the other copies are
	// duplicates.
	if p, d, dl := run.decisions(); p != len(parked) || d != parkedCopies-len(parked) || dl != 0 {
		t.Errorf("second run: %d processed, %d duplicates, %d dead letters; want %d, %d, 0\n%s",
			p, d, dl, len(parked), parkedCopies-len(parked), run.log.String())
	}
	after := ledgerCounts(t, db)
	if len(after) != unique {
		t.Errorf("%d payments in the ledger, want %d", len(after), unique)
	}
	var wrong []string
	for id := range parked {
		if after[id] != 1 {
			wrong = append(wrong, fmt.Sprintf("%s×%d", id, after[id]))
		}
	}
	for id, n := range after {
		if n != 1 && parked[id] == 0 {
			wrong = append(wrong, fmt.Sprintf("%s×%d", id, n))
		}
	}
	if len(wrong) > 0 {
		sort.Strings(wrong)
		t.Errorf("payments not applied exactly once: %v", wrong)
	}
	c.get("", ">0</a> in "+dlq.Name(), fmt.Sprintf(`<p class="estimate">%d claims`, unique))
	t.Logf("%d payments applied, %d of them redriven through the console (%v)", len(after), len(parked), time.Since(began).Round(time.Millisecond))
}

// ledgerCounts returns the payments service's ledger rows per message id.
func ledgerCounts(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT message_id, COUNT(*) FROM ledger GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sumCounts adds up m's counts.
func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
