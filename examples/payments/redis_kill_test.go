package main

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/servicetest"
)

// redisRecoveryBound is how long after a kill the last payment the killed
// service held may be committed, at default settings: its entries return
// to the group within 10 s (a restart under the same consumer name reads
// them back at once; another consumer reclaims them once idle for
// min_idle, 6 s, at its next XAUTOCLAIM, every poll of 0.5 s), plus 5 s
// for the handling: a -race build of the service starting, connecting and
// committing a window of payments on a busy 2-core machine.
const redisRecoveryBound = 15 * time.Second

// redisStream is a fresh stream on IDEMQ_REDIS_URL read by the group
// payments at default settings, and a client of the test's own; both go
// when the test ends.
type redisStream struct {
	base, name string
	rdb        *goredis.Client
}

func newRedisStream(t *testing.T) redisStream {
	base := redisURL(t)
	rdb, err := redisClient(base)
	if err != nil {
		t.Fatal(err)
	}
	rs := redisStream{base: base, name: "payments-" + randomHex(4), rdb: rdb}
	t.Cleanup(func() {
		rdb.Del(context.Background(), rs.name, rs.name+":dlq")
		rdb.Close()
	})
	return rs
}

// url is the stream's URL for the group payments, with query added.
func (rs redisStream) url(query string) string {
	u := rs.base + "/" + rs.name + "?group=payments"
	if query != "" {
		u += "&" + query
	}
	return u
}

// held returns the payment ids of the entries pending to consumer in the
// group payments, split by whether the ledger holds them (committed) or
// not.
func (rs redisStream) held(t *testing.T, consumer string, l ledgerDB) (committed, open []string) {
	t.Helper()
	ctx := context.Background()
	ps, err := rs.rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: rs.name, Group: "payments", Start: "-", End: "+", Count: 100000, Consumer: consumer}).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := l.contents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inLedger := map[string]bool{}
	for _, id := range ids {
		inLedger[id] = true
	}
	for _, p := range ps {
		xs, err := rs.rdb.XRange(ctx, rs.name, p.ID, p.ID).Result()
		if err != nil || len(xs) != 1 {
			t.Fatalf("entry %s: %v, %v", p.ID, xs, err)
		}
		id, _ := xs[0].Values["idemq-id"].(string)
		if inLedger[id] {
			committed = append(committed, id)
		} else {
			open = append(open, id)
		}
	}
	return committed, open
}

// pending returns the group's pending entries by consumer.
func (rs redisStream) pending(t *testing.T) map[string]int64 {
	t.Helper()
	p, err := rs.rdb.XPending(context.Background(), rs.name, "payments").Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Consumers
}

// waitCommitted waits until the ledger holds every id of ids and returns
// the time from since; it fails t after timeout.
func waitCommitted(t *testing.T, l ledgerDB, ids []string, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	for deadline := since.Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		got, _, err := l.contents(context.Background())
		if err == nil {
			in := map[string]bool{}
			for _, id := range got {
				in[id] = true
			}
			missing := 0
			for _, id := range ids {
				if !in[id] {
					missing++
				}
			}
			if missing == 0 {
				return time.Since(since)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of the %d payments the killed service held uncommitted still not in the ledger %v after the kill", missing, len(ids), timeout)
			}
		}
	}
}

// untilKilled waits for cmd, which is to die of SIGKILL (PAYMENTS_KILL_AT
// or the test's), and returns when it died; a run still alive after 2
// minutes is killed and fails t.
func untilKilled(t *testing.T, cmd *exec.Cmd, logPath string) time.Time {
	t.Helper()
	overdue := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	died := time.Now()
	if !overdue.Stop() {
		t.Fatalf("the run did not reach its kill point within 2 minutes:\n%s", tailLog(logPath))
	}
	if !killed(err) {
		t.Fatalf("the run ended by itself (%v) before it was killed:\n%s", err, tailLog(logPath))
	}
	return died
}

// The service, consuming a Redis stream at default settings, dies of
// SIGKILL at 90-95% of a 10,000-payment run, right after a commit (so it
// holds payments committed and not yet acknowledged, and others not yet
// committed), and is restarted at once under the same consumer name (the
// host name). The restarted source reads back the entries its name holds
// before anything else: the last payment the killed run held is committed
// within redisRecoveryBound of the kill, every payment is applied once,
// and after the graceful stop nothing is pending.
func TestRedisKillRestartUnderTheSameName(t *testing.T) {
	t.Parallel()
	store, prefix, l := mysqlStore(t)
	rs := newRedisStream(t)
	const messages = 10000
	r := killRun{broker: rs.url(""), store: store, tables: prefix, ledger: l, messages: messages, batch: 20, concurrency: 2}
	bin := serviceBinary(t)
	seed := mrand.Uint64N(1 << 30)
	unique, want := publishTraffic(t, bin, r, seed)
	logs := t.TempDir()
	at := messages*90/100 + mrand.IntN(messages*5/100)
	run0 := filepath.Join(logs, "run-0.log")
	died := untilKilled(t, startService(t, bin, run0, r.serviceArgs(r.broker), []string{fmt.Sprintf("%s=commit:%d", killEnv, at)}), run0)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	committed, open := rs.held(t, host, l)
	t.Logf("seed %d: killed after %d commits, holding %d payments committed and %d not", seed, at, len(committed), len(open))
	if len(committed) == 0 || len(open) == 0 {
		t.Fatalf("the killed run held %d committed and %d uncommitted payments; want some of each", len(committed), len(open))
	}

	run1 := filepath.Join(logs, "run-1.log")
	cmd := startService(t, bin, run1, r.serviceArgs(r.broker), nil)
	took := waitCommitted(t, l, open, died, time.Minute)
	t.Logf("REDIS-RECOVERY restart under the same name: kill → last held payment committed %v", took.Round(10*time.Millisecond))
	if took > redisRecoveryBound {
		t.Errorf("the last payment the killed run held was committed %v after the kill, want within %v", took.Round(10*time.Millisecond), redisRecoveryBound)
	}
	servicetest.WaitFor(t, 2*time.Minute, "every payment in the ledger", func() bool { return ledgerRows(l) >= len(unique) })
	stopService(t, "the restarted run", cmd, run1)
	checkLedger(t, l, unique, want)
	redisSettled(t, rs.rdb, rs.name, messages)
}

// Two replicas of the service consume a Redis stream at default settings
// under consumer names of their own; one dies of SIGKILL at 90-95% of a
// 10,000-payment run, holding payments, and is not restarted. The live
// replica reclaims the dead one's entries once idle for min_idle: the last
// payment the dead replica held is committed within redisRecoveryBound
// of the kill, every payment is applied once, and after the graceful stop
// nothing is pending.
func TestRedisKillTakenOverByALiveConsumer(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	rs := newRedisStream(t)
	const messages = 10000
	r := killRun{broker: rs.url(""), store: store, tables: prefix, ledger: l, messages: messages, batch: 20, concurrency: 2}
	bin := serviceBinary(t)
	seed := mrand.Uint64N(1 << 30)
	unique, want := publishTraffic(t, bin, r, seed)
	logs := t.TempDir()
	var cmds [2]*exec.Cmd
	var paths [2]string
	for i := range cmds {
		paths[i] = filepath.Join(logs, fmt.Sprintf("replica-%d.log", i))
		cmds[i] = startService(t, bin, paths[i], r.serviceArgs(rs.url(fmt.Sprintf("consumer=replica-%d", i))), nil)
	}
	defer func() {
		for _, c := range cmds {
			if c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	}()
	at := messages*90/100 + mrand.IntN(messages*5/100)
	servicetest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d payments in the ledger", at), func() bool { return ledgerRows(l) >= at })
	if err := cmds[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died := untilKilled(t, cmds[0], paths[0])
	committed, open := rs.held(t, "replica-0", l)
	t.Logf("seed %d: replica-0 killed at %d ledger rows, holding %d payments committed and %d not", seed, at, len(committed), len(open))
	if len(open) == 0 {
		t.Fatalf("replica-0 held no uncommitted payment when it was killed")
	}
	took := waitCommitted(t, l, open, died, time.Minute)
	t.Logf("REDIS-RECOVERY taken over by a live consumer: kill → last held payment committed %v", took.Round(10*time.Millisecond))
	if took > redisRecoveryBound {
		t.Errorf("the last payment the dead replica held was committed %v after the kill, want within %v", took.Round(10*time.Millisecond), redisRecoveryBound)
	}
	servicetest.WaitFor(t, 2*time.Minute, "every payment in the ledger and nothing pending", func() bool {
		return ledgerRows(l) >= len(unique) && redisDrained(rs.rdb, rs.name) == nil
	})
	stopService(t, "replica-1", cmds[1], paths[1])
	checkLedger(t, l, unique, want)
	redisSettled(t, rs.rdb, rs.name, messages)
}

// The service dies of SIGKILL right after committing the last payments of
// a run, before acknowledging them, and is restarted under the same
// consumer name; more payments come, are applied, and the service is
// stopped gracefully at once. Nothing stays pending: the restarted source
// read back what its name held and settled it (Duplicate) before the new
// payments, rather than leaving it for a reclaim after min_idle that the
// stop came before.
func TestRedisNothingPendingAfterTheStop(t *testing.T) {
	t.Parallel()
	store, prefix, l := mysqlStore(t)
	rs := newRedisStream(t)
	const first, more = 500, 100
	r := killRun{broker: rs.url(""), store: store, tables: prefix, ledger: l, messages: first, batch: 20, concurrency: 2}
	bin := serviceBinary(t)
	seed := mrand.Uint64N(1 << 30)
	unique, want := publishTraffic(t, bin, r, seed)
	logs := t.TempDir()
	run0 := filepath.Join(logs, "run-0.log")
	untilKilled(t, startService(t, bin, run0, r.serviceArgs(r.broker), []string{fmt.Sprintf("%s=commit:%d", killEnv, first)}), run0)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	committed, open := rs.held(t, host, l)
	if len(committed) == 0 || len(open) != 0 {
		t.Fatalf("the killed run held %d committed and %d uncommitted payments; want only committed ones", len(committed), len(open))
	}

	run1 := filepath.Join(logs, "run-1.log")
	cmd := startService(t, bin, run1, r.serviceArgs(r.broker), nil)
	r.messages = more
	moreUnique, moreWant := publishTraffic(t, bin, r, seed+1)
	unique = append(unique, moreUnique...)
	for a, v := range moreWant {
		want[a] += v
	}
	servicetest.WaitFor(t, time.Minute, "the new payments in the ledger", func() bool { return ledgerRows(l) >= len(unique) })
	stopService(t, "the restarted run", cmd, run1)
	checkLedger(t, l, unique, want)
	if p := rs.pending(t); len(p) != 0 {
		t.Errorf("after the graceful stop, pending by consumer: %v; the killed run held %d committed payments (%v…)", p, len(committed), committed[:min(3, len(committed))])
	}
	redisSettled(t, rs.rdb, rs.name, first+more)
}

// go-redis's own lines (here: the dial that failed after its retries)
// come out through the service's structured logger, never as go-redis's
// raw "redis: 2006/01/02 …" lines on stderr.
func TestRedisClientLogIsStructured(t *testing.T) {
	t.Parallel()
	port := servicetest.FreePort(t) // nothing listens there
	cmd := exec.Command(serviceBinary(t), "--broker", fmt.Sprintf("redis://127.0.0.1:%d/payments?group=payments", port),
		"--store", "sqlite://"+filepath.Join(t.TempDir(), "p.db"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the service ran with nothing listening at its broker:\n%s", out)
	}
	var structured bool
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(line, "time=") {
			t.Errorf("an unstructured line: %q", line)
		}
		if strings.Contains(line, `msg="idemq redis: go-redis log"`) && strings.Contains(line, "failed to dial") && strings.Contains(line, "level=WARN") {
			structured = true
		}
	}
	if !structured {
		t.Errorf("no structured record of go-redis's failed dial in the service's output:\n%s", out)
	}
	if !slices.ContainsFunc(strings.Split(string(out), "\n"), func(l string) bool { return strings.Contains(l, "connecting to 127.0.0.1") }) {
		t.Errorf("the service's output does not say it could not connect:\n%s", out)
	}
}
