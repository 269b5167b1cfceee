package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/effects/effectstest"
)

// leasedKillPoints are where the leased mode's runs die, in order: after
// the claim in progress committed (killed by the service itself,
// PAYMENTS_KILL_AT), during the provider call (killed by the test from the
// provider while it holds a charge it made), after the call returned and
// before the completion committed, and after the completion committed and
// before the ack.
var leasedKillPoints = []string{"lease", "during", "external", "commit"}

// runLeasedKills runs the leased mode (--provider) against a fake payment
// provider, kills it once at each of leasedKillPoints, lets a last run
// drain the queue, and checks the provider charged each unique payment
// exactly once and the ledger booked it exactly once, to the cent.
func runLeasedKills(t *testing.T, r killRun) {
	prov := effectstest.NewProvider()
	t.Cleanup(prov.Close)
	prov.SetDelay(20 * time.Millisecond)

	// The "during" run dies when the provider, holding a charge it made,
	// sees its at-th request; the others die by their own hand.
	var mu sync.Mutex
	var victim *exec.Cmd
	var during atomic.Int64
	var at int64 = 150 + int64(time.Now().UnixNano()%300)
	prov.OnCharge(func(effectstest.Charge) {
		mu.Lock()
		cmd := victim
		mu.Unlock()
		if cmd != nil && during.Add(1) == at {
			cmd.Process.Signal(syscall.SIGKILL)
			time.Sleep(50 * time.Millisecond) // answer after the client died
		}
	})
	var overdue atomic.Bool
	r.kills = len(leasedKillPoints)
	r.args = append(r.args, "--provider", prov.URL(), "--lease", "2s", "--window", "200")
	r.env = func(i int) []string {
		env := []string{keySecretEnv + "=leased-kill-test-secret-0123456789"}
		if i < len(leasedKillPoints) && leasedKillPoints[i] != "during" {
			env = append(env, fmt.Sprintf("%s=%s:%d", killEnv, leasedKillPoints[i], 200+i*150))
		}
		return env
	}
	r.kill = func(i int, cmd *exec.Cmd) func() {
		if leasedKillPoints[i] == "during" {
			mu.Lock()
			victim = cmd
			mu.Unlock()
		}
		// A run that never reaches its kill point would run forever.
		tm := time.AfterFunc(2*time.Minute, func() {
			overdue.Store(true)
			cmd.Process.Kill()
		})
		return func() { tm.Stop() }
	}
	res := runKillAndRestart(t, r)
	if overdue.Load() {
		t.Error("a run did not reach its kill point within 2 minutes and was killed by the test")
	}
	if during.Load() < at {
		t.Errorf("the provider saw %d charges while the \"during\" run lived, want at least %d: it was not killed mid-call", during.Load(), at)
	}
	for i, point := range leasedKillPoints {
		log, _ := os.ReadFile(filepath.Join(res.logs, fmt.Sprintf("run-%d.log", i)))
		if point != "during" && !strings.Contains(string(log), "after_stage="+point) {
			t.Errorf("run %d did not die at %q (no kill line in its log)", i, point)
		}
	}

	want := map[string]int64{}
	for _, p := range res.unique {
		want[p.Account] += p.AmountCents
	}
	if n := prov.Charges(); n != len(res.unique) {
		t.Errorf("the provider made %d charges for %d unique payments", n, len(res.unique))
	}
	for _, key := range prov.Keys() {
		if n := prov.ChargesFor(key); n != 1 {
			t.Errorf("key %s charged %d times", key, n)
		}
	}
	byAccount := prov.ChargesByAccount()
	for a, v := range want {
		if byAccount[a] != v {
			t.Errorf("account %s: charged %d, want %d", a, byAccount[a], v)
		}
	}
	t.Logf("provider: %d charges, %d requests, %d replayed, %d conflicts", prov.Charges(), prov.Requests(), prov.Replays(), prov.Conflicts())
}

// The leased mode killed at each of its four points: 10,000 payments with
// 20% duplicates, one charge and one ledger row per payment.
func TestLeasedKillPointsRabbitMQPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	runLeasedKills(t, onRabbitMQ(t, killRun{store: store, tables: prefix, ledger: l,
		messages: 10000, duplicates: 0.2, batch: 20, concurrency: 1}))
}

// The same on MariaDB: the lease table's row locks and the completion's
// fence under InnoDB.
func TestLeasedKillPointsRabbitMQMariaDB(t *testing.T) {
	t.Parallel()
	store, prefix, l := mysqlStore(t)
	runLeasedKills(t, onRabbitMQ(t, killRun{store: store, tables: prefix, ledger: l,
		messages: 10000, duplicates: 0.2, batch: 20, concurrency: 1}))
}
