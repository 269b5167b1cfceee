//go:build faults

package main

import (
	"fmt"
	mrand "math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFaultCrashLoop runs, on each broker with the Postgres store, three
// competing replicas of the service over the same traffic twice, on fresh
// tables and a fresh queue each time: once undisturbed (the baseline),
// then with one replica, picked at random, SIGKILLed every 6-12 s and
// restarted at once. Each phase must apply every unique payment exactly
// once; the FAULT-MATRIX line gives both times to a complete ledger.
func TestFaultCrashLoop(t *testing.T) {
	brokers := []struct {
		name string
		on   func(*testing.T, killRun) killRun
		// replica, if set, gives each replica slot a URL of its own.
		replica func(broker string, slot int) string
		batch   int
		// messages are each phase's traffic (20% duplicates): 12-30 s
		// of work for three replicas on a busy 2-core machine, so a crash
		// loop sees a kill or two and the test stays within minutes.
		messages int
	}{
		// Sized so that each phase outlasts the first kill (6-12 s):
		// the replicas drain 90,000 in under 10 s on a quiet machine.
		{"RabbitMQ", onRabbitMQ, nil, 20, 240000},
		// Kafka replicas are static members (instance_id per slot): a
		// restarted one takes its partitions back, the others keep theirs.
		{"Kafka", onKafka, kafkaReplica, 20, 250000},
		{"Kafka-KIP848", onKafkaConsumerProtocol, kafkaReplica, 20, 250000},
		{"SQS", onSQS, nil, 10, 120000},
		{"NATS", onNATS, nil, 20, 200000},
		// A Redis consumer is named after its host unless the URL names
		// it: replicas on one host need names of their own, kept across
		// a restart as a StatefulSet keeps a pod's.
		{"Redis", onRedis, func(broker string, slot int) string {
			return withQuery(broker, "consumer", fmt.Sprintf("replica-%d", slot))
		}, 20, 300000},
	}
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			phase := func(t *testing.T, loop bool, limit time.Duration) (time.Duration, int) {
				store, prefix, l := postgresStore(t)
				r := b.on(t, killRun{store: store, tables: prefix, ledger: l,
					messages: b.messages, duplicates: 0.2, batch: b.batch, concurrency: 2})
				return runReplicas(t, r, b.replica, loop, limit)
			}
			var baseline time.Duration
			t.Run("baseline", func(t *testing.T) { baseline, _ = phase(t, false, 3*time.Minute) })
			if baseline == 0 {
				t.Fatal("no baseline")
			}
			var looped time.Duration
			var kills int
			t.Run("loop", func(t *testing.T) { looped, kills = phase(t, true, 10*baseline) })
			if looped == 0 {
				t.Fatal("the crash loop did not complete")
			}
			if kills == 0 {
				t.Fatalf("the crash loop completed in %v, before its first kill: make the run bigger", looped.Round(time.Millisecond))
			}
			t.Logf("FAULT-MATRIX crash-loop %s: baseline %.1f s, with a replica killed every 6-12 s %.1f s (ratio %.1f), %d kills",
				b.name, baseline.Seconds(), looped.Seconds(), looped.Seconds()/baseline.Seconds(), kills)
		})
	}
}

// runReplicas publishes r's traffic, consumes it with three replicas of
// the service and returns the time from their start to a complete ledger
// (zero if the test failed). With loop, one replica picked at random is
// SIGKILLed every 6-12 s and restarted at once until then; the ledger must
// complete within limit. Then the replicas stop on SIGTERM and the ledger
// and the broker are checked as runKillAndRestart checks them.
func runReplicas(t *testing.T, r killRun, replica func(string, int) string, loop bool, limit time.Duration) (time.Duration, int) {
	bin := serviceBinary(t)
	seed := mrand.Uint64N(1 << 30)
	t.Logf("seed %d, %d messages, %.0f%% duplicates, 3 replicas, batch %d, concurrency %d", seed, r.messages, 100*r.duplicates, r.batch, r.concurrency)
	unique, want := publishTraffic(t, bin, r, seed)
	rows := func() int { return ledgerRows(r.ledger) }

	logs := t.TempDir()
	type slot struct {
		cmd  *exec.Cmd
		log  string
		runs int
	}
	var slots [3]slot
	start := func(i int) {
		s := &slots[i]
		broker := r.broker
		if replica != nil {
			broker = replica(broker, i)
		}
		s.log = filepath.Join(logs, fmt.Sprintf("replica-%d-run-%d.log", i, s.runs))
		s.runs++
		s.cmd = startService(t, bin, s.log, r.serviceArgs(broker), nil)
	}
	began := time.Now()
	for i := range slots {
		start(i)
	}
	defer func() { // a failed run leaves no process behind
		for _, s := range slots {
			if s.cmd.ProcessState == nil {
				s.cmd.Process.Kill()
				s.cmd.Wait()
			}
		}
	}()

	rng := mrand.New(mrand.NewPCG(seed, 2))
	nextKill := func() time.Time {
		return time.Now().Add(6*time.Second + time.Duration(rng.Int64N(int64(6*time.Second))))
	}
	kills, killAt := 0, nextKill()
	for rows() < len(unique) {
		if time.Since(began) > limit {
			t.Fatalf("%d of %d unique payments applied after %v (%d kills); the replicas' last lines:\n%s",
				rows(), len(unique), limit.Round(time.Second), kills, lastLines(slots[0].log, slots[1].log, slots[2].log))
		}
		if loop && time.Now().After(killAt) {
			i := rng.IntN(len(slots))
			s := &slots[i]
			if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatalf("kill replica %d: %v", i, err)
			}
			if err := s.cmd.Wait(); !killed(err) {
				t.Fatalf("replica %d ended by itself (%v) before it was killed:\n%s", i, err, tailLog(s.log))
			}
			kills++
			t.Logf("kill %d: replica %d at %v, %d ledger rows", kills, i, time.Since(began).Round(time.Millisecond), rows())
			start(i)
			killAt = nextKill()
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(began)
	t.Logf("all %d unique ids in the ledger after %v, %d kills", len(unique), elapsed.Round(time.Millisecond), kills)

	if r.drained != nil {
		for deadline := time.Now().Add(time.Minute); !r.drained() && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(time.Second) // give a late double charge the chance to land
	for i, s := range slots {
		stopService(t, fmt.Sprintf("replica %d", i), s.cmd, s.log)
	}
	checkLedger(t, r.ledger, unique, want)
	if r.settled != nil {
		r.settled(t)
	}
	if t.Failed() {
		return 0, kills
	}
	return elapsed, kills
}

// lastLines returns the tail of each log, headed by its name.
func lastLines(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "== %s\n%s\n", filepath.Base(p), tailLog(p))
	}
	return b.String()
}
