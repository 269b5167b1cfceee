package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/internal/servicetest"
)

// The webhook kill tests: the service serves --broker webhook://… on a
// fixed loopback port while senders post every payment as a Standard
// Webhooks sender does (signed, retried on its schedule until a 2xx),
// some of them in several concurrent copies, and the service is SIGKILLed
// mid-request and restarted on the same port a few times.

// standardWebhooksSchedule is the Standard Webhooks retry schedule: the
// wait before each attempt, the first immediately.
var standardWebhooksSchedule = []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// compressedWait is a wait of the schedule a thousand times shorter, at
// least 50 ms (but immediately stays immediately): 0, 50 ms, 300 ms,
// 1.8 s, 7.2 s, 18 s, 36 s, 36 s.
func compressedWait(d time.Duration) time.Duration {
	if d == 0 {
		return 0
	}
	return max(d/1000, 50*time.Millisecond)
}

// webhookSender posts events to a webhook inbox as a Standard Webhooks
// sender does: each attempt signed afresh with the v1 HMAC of
// "id.timestamp.body", and any answer but a 2xx, or none, retried after
// the schedule's next wait (compressedWait), the last failure giving up.
type webhookSender struct {
	url    string
	key    []byte // the HMAC key the whsec_ secret encodes
	client *http.Client

	inflight atomic.Int64 // requests sent and not answered
	sends    atomic.Int64 // every attempt
	refused  atomic.Int64 // attempts that found no server listening
	cut      atomic.Int64 // attempts whose connection broke before an answer
	mu       sync.Mutex
	statuses map[int]int // answers by status code
}

// newWebhookSender returns a sender to url signing with secret (whsec_…).
func newWebhookSender(t *testing.T, url, secret string) *webhookSender {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	t.Cleanup(tr.CloseIdleConnections)
	// The timeout is the sender's: far above a copy's wait for its first
	// (wait=, 2 s in these tests), so only a hung service meets it.
	return &webhookSender{url: url, key: key, client: &http.Client{Transport: tr, Timeout: 20 * time.Second},
		statuses: map[int]int{}}
}

// deliver sends the event until an attempt is answered 2xx and returns
// that attempt's number, or 0 when every attempt of the schedule failed.
func (s *webhookSender) deliver(id string, body []byte) int {
	for i, wait := range standardWebhooksSchedule {
		time.Sleep(compressedWait(wait))
		if s.attempt(id, body) {
			return i + 1
		}
	}
	return 0
}

// attempt posts the event once and reports whether it was answered 2xx.
func (s *webhookSender) attempt(id string, body []byte) bool {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signature.HeaderWebhookID, id)
	req.Header.Set(signature.HeaderWebhookTimestamp, ts)
	req.Header.Set(signature.HeaderWebhookSignature, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	s.sends.Add(1)
	s.inflight.Add(1)
	resp, err := s.client.Do(req)
	s.inflight.Add(-1)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			s.refused.Add(1)
		} else {
			s.cut.Add(1)
		}
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s.mu.Lock()
	s.statuses[resp.StatusCode]++
	s.mu.Unlock()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// webhookRun describes one webhook kill-and-restart run.
type webhookRun struct {
	store, tables string
	ledger        ledgerDB
	// messages are the deliveries of the traffic (duplicates of earlier
	// events included, sent later as a resend would be); copies of them
	// are each sent as `copies` concurrent deliveries.
	messages   int
	duplicates float64
	copies     float64
	// kills alternate: the service kills itself right after a commit,
	// before the request is answered (PAYMENTS_KILL_AT=commit:N), then
	// the test SIGKILLs it while requests are in flight.
	kills   int
	senders int
}

// runWebhookKills runs r: it starts the service on a webhook:// URL,
// delivers the traffic with r.senders senders while the service is
// SIGKILLed r.kills times and restarted on the same port each time, stops
// the last run with SIGTERM once every delivery was answered 2xx, and
// checks that the ledger holds exactly one row per event with exact
// balances and that nothing was parked.
func runWebhookKills(t *testing.T, r webhookRun) {
	bin := serviceBinary(t)
	began := time.Now()
	seed := mrand.Uint64N(1 << 30)
	rng := mrand.New(mrand.NewPCG(seed, 3))
	sends, unique := traffic(seed, r.messages, r.duplicates, 50)
	want := map[string]int64{}
	for _, p := range unique {
		want[p.Account] += p.AmountCents
	}

	dir := t.TempDir()
	key := make([]byte, 24)
	rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	secretFile, parked := filepath.Join(dir, "secret"), filepath.Join(dir, "parked")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(parked, 0o700); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", servicetest.FreePort(t))
	broker := "webhook://" + addr + "/hooks/payments?verify=standard&secret_file=" + secretFile +
		"&park_dir=" + parked + "&wait=2s"
	args := []string{"--broker", broker, "--store", r.store, "--tables", r.tables, "--consumer", "payments",
		"--batch", "10", "--concurrency", "2"}
	sender := newWebhookSender(t, "http://"+addr+"/hooks/payments", secret)

	// deliveries: each of sends, fanned out into 3 concurrent copies for a
	// fraction r.copies of them.
	type delivery struct {
		sent
		copies int
	}
	var deliveries []delivery
	total := 0
	for _, s := range sends {
		n := 1
		if rng.Float64() < r.copies {
			n = 3
		}
		deliveries = append(deliveries, delivery{s, n})
		total += n
	}
	t.Logf("seed %d: %d events, %d deliveries of them (%d resends, %d sent in 3 concurrent copies), %d senders, %d kills",
		seed, len(unique), total, len(sends)-len(unique), (total-len(sends))/2, r.senders, r.kills)

	logs := t.TempDir()
	var cmd *exec.Cmd
	t.Cleanup(func() { // a failed run leaves no process behind
		if cmd != nil && cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	start := func(i int, env []string) string {
		logPath := filepath.Join(logs, fmt.Sprintf("run-%d.log", i))
		cmd = startService(t, bin, logPath, args, env)
		return logPath
	}
	listening := func(logPath string) {
		servicetest.WaitFor(t, time.Minute, "the service listening on "+addr, func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
				return true
			}
			// A run that kills itself after its first commits can be gone
			// between two dials: its kill line shows it listened.
			log, _ := os.ReadFile(logPath)
			return bytes.Contains(log, []byte("after_stage=commit"))
		})
	}
	// Run i < r.kills dies: the even ones by their own hand right after
	// a commit (PAYMENTS_KILL_AT=commit:N), the odd ones by the test's
	// SIGKILL while requests are in flight. The last run lives.
	per := max(1, len(unique)/(r.kills+2))
	faultEnv := func(i int) []string {
		if i < r.kills && i%2 == 0 {
			return []string{fmt.Sprintf("%s=commit:%d", killEnv, 1+rng.IntN(per))}
		}
		return nil
	}
	logPath := start(0, faultEnv(0))
	listening(logPath)

	// The senders: each takes the next delivery and sends its copies at
	// once, each copy retried on the schedule until a 2xx.
	var next atomic.Int64
	var mu sync.Mutex
	attempts := map[int]int{} // successful deliveries by the attempt that succeeded
	var failed []string
	var wg sync.WaitGroup
	for range r.senders {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(deliveries) {
					return
				}
				d := deliveries[i]
				body, _ := json.Marshal(d.payment)
				var copies sync.WaitGroup
				for range d.copies {
					copies.Go(func() {
						n := sender.deliver(d.id, body)
						mu.Lock()
						attempts[n]++
						if n == 0 {
							failed = append(failed, d.id)
						}
						mu.Unlock()
					})
				}
				copies.Wait()
			}
		})
	}
	sent := make(chan struct{})
	go func() { wg.Wait(); close(sent) }()

	rows := func() int { return ledgerRows(r.ledger) }
	prev, selfKills, cutMark := 0, 0, int64(0)
	for i := range r.kills {
		how := "by its own hand after a commit"
		if i%2 == 0 {
			c := cmd
			tm := time.AfterFunc(2*time.Minute, func() { c.Process.Kill() })
			err := cmd.Wait()
			tm.Stop()
			if log, _ := os.ReadFile(logPath); !killed(err) || !bytes.Contains(log, []byte("after_stage=commit")) {
				t.Fatalf("run %d did not kill itself after a commit (%v):\n%s", i, err, tailLog(logPath))
			}
			selfKills++
		} else {
			step := 1 + rng.IntN(per)
			servicetest.WaitFor(t, time.Minute, "new ledger rows", func() bool { return rows() >= prev+step })
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
			servicetest.WaitFor(t, time.Minute, "a request in flight", func() bool { return sender.inflight.Load() > 0 })
			how = fmt.Sprintf("by the test with %d requests in flight", sender.inflight.Load())
			cmd.Process.Signal(syscall.SIGKILL)
			if err := cmd.Wait(); !killed(err) {
				t.Fatalf("run %d ended by itself (%v) before it was killed:\n%s", i, err, tailLog(logPath))
			}
		}
		died, now := time.Now(), rows()
		if now >= len(unique) {
			t.Fatalf("run %d applied every event before its kill: make the traffic bigger", i)
		}
		logPath = start(i+1, faultEnv(i+1)) // on the same port
		listening(logPath)
		// The requests the kill cut got their error as the process died,
		// before the next run listened.
		cut := sender.cut.Load()
		t.Logf("run %d SIGKILLed %s at %v with %d ledger rows (%d new), %d requests cut; run %d listening %v later",
			i, how, died.Sub(began).Round(time.Millisecond), now, now-prev, cut-cutMark,
			i+1, time.Since(died).Round(time.Millisecond))
		prev, cutMark = now, cut
	}

	// The last run answers until every delivery was answered 2xx (or gave
	// up), then stops on SIGTERM.
	select {
	case <-sent:
	case <-time.After(3 * time.Minute):
		t.Fatalf("deliveries still going after 3m (%d ledger rows):\n%s", rows(), tailLog(logPath))
	}
	t.Logf("every delivery done at %v", time.Since(began).Round(time.Millisecond))
	stopService(t, "last run", cmd, logPath)

	checkLedger(t, r.ledger, unique, want)
	if len(failed) > 0 {
		slices.Sort(failed)
		t.Errorf("%d deliveries never answered 2xx in %d attempts: %v", len(failed), len(standardWebhooksSchedule), head(failed))
	}
	if entries, err := os.ReadDir(parked); err != nil || len(entries) > 0 {
		t.Errorf("the inbox parked %d requests (%v): every payment is valid", len(entries), err)
	}
	// Each self-kill died holding the request whose commit it followed.
	if cut := sender.cut.Load(); cut < int64(selfKills) {
		t.Errorf("%d requests cut by the kills, want at least one per self-kill (%d)", cut, selfKills)
	}
	duplicates := 0
	for i := 0; i <= r.kills; i++ {
		b, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("run-%d.log", i)))
		duplicates += strings.Count(string(b), "decision=duplicate")
	}
	t.Logf("senders: %d events, %d deliveries, %d sends (%d refused while down, %d cut mid-request, answers %v); deliveries by the attempt answered 2xx %v; %d duplicate decisions; %d kills (%d after a commit); total %v",
		len(unique), total, sender.sends.Load(), sender.refused.Load(), sender.cut.Load(), sender.statuses,
		attempts, duplicates, r.kills, selfKills, time.Since(began).Round(time.Millisecond))
}

// webhookTraffic is the traffic of each webhook kill test: 1,500
// deliveries, 20% of them resends of an earlier event and 20% sent in 3
// concurrent copies; IDEMQ_PAYMENTS_MESSAGES sets fewer or more.
func webhookTraffic(t *testing.T) webhookRun {
	n := 1500
	if os.Getenv("IDEMQ_PAYMENTS_MESSAGES") != "" {
		n = killMessages(t)
	}
	return webhookRun{messages: n, duplicates: 0.2, copies: 0.2, kills: 4, senders: 24}
}

// TestWebhookKillAndRestartSQLite: signed webhooks into the default store,
// one effect per event through kills mid-request.
func TestWebhookKillAndRestartSQLite(t *testing.T) {
	t.Parallel()
	r := webhookTraffic(t)
	r.store, r.tables, r.ledger = sqliteStore(t)
	runWebhookKills(t, r)
}

// TestWebhookKillAndRestartPostgres: the same into PostgreSQL.
func TestWebhookKillAndRestartPostgres(t *testing.T) {
	t.Parallel()
	r := webhookTraffic(t)
	r.store, r.tables, r.ledger = postgresStore(t)
	runWebhookKills(t, r)
}

// A webhook inbox has nothing to publish to: --publish with a webhook://
// broker is a flag error, before anything listens.
func TestWebhookRefusesPublish(t *testing.T) {
	_, err := parseFlags([]string{"--broker", "webhook://127.0.0.1:1/hooks?verify=standard&secret_env=S&park_dir=/p", "--publish", "10"}, io.Discard)
	if !errors.Is(err, errPushPublish) {
		t.Errorf("--publish to a webhook inbox: %v, want %v", err, errPushPublish)
	}
}
