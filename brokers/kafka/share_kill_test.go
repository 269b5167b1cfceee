package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
)

// envKillHelper selects TestShareKillHelper's consumer mode; it holds the
// member's killConfig as JSON.
const envKillHelper = "IDEMQ_TEST_KAFKA_SHARE_KILL_HELPER"

// killConfig is what a consumer process of TestShareKilledMember runs.
type killConfig struct {
	Source   string // kafka+share:// URL
	Postgres string // the store's database
	Inbox    string // the store's dedup table
	Effects  string // the handler's table, one row per committed effect
	Member   string // this process's name, written into each effect row
}

// killHandlerSleep stretches each handler, so the run lasts seconds and a
// member always holds records when it is killed.
const killHandlerSleep = 3 * time.Millisecond

// killObserver writes one line to stdout per decision started and ended,
// with the record's offset and delivery count, for the parent process to
// follow: a line written before a SIGKILL reaches it all the same.
type killObserver struct{ mu sync.Mutex }

func killOffset(m *core.Message) string {
	if v, ok := driver.MetadataOf(m.Metadata)["messaging.kafka.offset"]; ok {
		return v
	}
	return "-1"
}

func (o *killObserver) emit(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func (o *killObserver) StartDecision(ctx context.Context, m *core.Message) context.Context {
	o.emit("start %s %d %s", killOffset(m), m.Attempt, m.ID)
	return ctx
}

func (o *killObserver) EndDecision(_ context.Context, m *core.Message, out core.Outcome) {
	o.emit("end %s %d %s %s", killOffset(m), m.Attempt, m.ID, out.Decision)
}

// TestShareKillHelper is a consumer process TestShareKilledMember starts (and
// kills); on its own it skips. It runs a Consumer over the share group
// until SIGTERM, its handler inserting one effect row per message in the
// claim's transaction, and prints its Stats last.
func TestShareKillHelper(t *testing.T) {
	raw := os.Getenv(envKillHelper)
	if raw == "" {
		t.Skip("a consumer process of TestShareKilledMember")
	}
	var cfg killConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	src, err := OpenShare(ctx, cfg.Source)
	if err != nil {
		t.Fatal(err)
	}
	store, err := postgres.Open(ctx, cfg.Postgres, postgres.WithTable(cfg.Inbox), postgres.WithMigrate(false))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	insert := "INSERT INTO " + cfg.Effects + " (id, member) VALUES ($1, $2)"
	obs := &killObserver{}
	c, err := core.New[pgx.Tx](src, store, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		time.Sleep(killHandlerSleep)
		_, err := tx.Exec(ctx, insert, m.ID, cfg.Member)
		return err
	}, core.WithName("kill"), core.WithWindow(10), core.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	obs.emit("ready")
	err = c.Run(ctx)
	st, _ := json.Marshal(c.Stats())
	obs.emit("stats %s", st)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// killDecision is one "end" line of a member.
type killDecision struct {
	offset, attempt int
	id, decision    string
}

// killMember is a consumer process of TestShareKilledMember and what it printed.
type killMember struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
	err  error         // Wait's, once done

	mu       sync.Mutex
	partial  []byte
	inflight map[int]bool // offsets started, not yet ended
	ends     []killDecision
	stats    core.Stats
	hasStats bool
	lastLine time.Time
	stderr   bytes.Buffer
}

// Write takes the process's stdout, line by line.
func (m *killMember) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.partial = append(m.partial, p...)
	for {
		i := bytes.IndexByte(m.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		m.line(string(m.partial[:i]))
		m.partial = m.partial[i+1:]
	}
}

// line records one line of output; m.mu is held.
func (m *killMember) line(l string) {
	f := strings.Fields(l)
	if len(f) == 0 {
		return
	}
	m.lastLine = time.Now()
	switch f[0] {
	case "start":
		if len(f) == 4 {
			off, _ := strconv.Atoi(f[1])
			m.inflight[off] = true
		}
	case "end":
		if len(f) == 5 {
			off, _ := strconv.Atoi(f[1])
			att, _ := strconv.Atoi(f[2])
			delete(m.inflight, off)
			m.ends = append(m.ends, killDecision{offset: off, attempt: att, id: f[3], decision: f[4]})
		}
	case "stats":
		m.hasStats = json.Unmarshal([]byte(strings.TrimPrefix(l, "stats ")), &m.stats) == nil
	}
}

func (m *killMember) inflightOffsets() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for off := range m.inflight {
		out = append(out, off)
	}
	sort.Ints(out)
	return out
}

func (m *killMember) decisions() []killDecision {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]killDecision(nil), m.ends...)
}

func (m *killMember) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// startKillMember starts a consumer process running cfg; it is killed when t
// ends if it is still running.
func startKillMember(t *testing.T, cfg killConfig) *killMember {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &killMember{name: cfg.Member, done: make(chan struct{}), inflight: map[int]bool{}}
	m.cmd = exec.Command(os.Args[0], "-test.run=^TestShareKillHelper$", "-test.count=1", "-test.v=false")
	m.cmd.Env = append(os.Environ(), envKillHelper+"="+string(raw))
	m.cmd.Stdout = m
	m.cmd.Stderr = &killLockedWriter{mu: &m.mu, w: &m.stderr}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		m.err = m.cmd.Wait()
		close(m.done)
	}()
	t.Cleanup(func() {
		if !m.exited() {
			_ = m.cmd.Process.Kill()
			<-m.done
		}
	})
	return m
}

// killLockedWriter writes to w under mu.
type killLockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *killLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (m *killMember) stderrTail() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stderr.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// TestShareKilledMember runs several consumer processes in one share group on
// one partition, over records with duplicate ids, and SIGKILLs one of
// them while it holds locked records; a replacement joins. The killed
// member's records come back after their lock and are applied once or
// decided Duplicate: every id's effect is committed exactly once and none
// is lost, counted in the effects table, not in receipts.
func TestShareKilledMember(t *testing.T) {
	pgURL := servicetest.PostgresURL(t)
	bs := shareCluster(t, 10)
	topic := newTopic(t, bs, 1)
	group := "g-" + randomHex(3)
	suffix := randomHex(4)
	inbox, effects := "kshare_kill_inbox_"+suffix, "kshare_kill_effects_"+suffix
	ctx := context.Background()

	store, err := postgres.Open(ctx, pgURL, postgres.WithTable(inbox))
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	pool := store.Pool()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (id text NOT NULL, member text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+effects+", "+inbox)
		store.Close()
	})

	// 500 ids, 100 of them twice: every tenth record is a copy of the one
	// before it (the two often in one poll, or at two members at once),
	// every other tenth a copy of an id from the other half of the topic.
	const unique = 500
	var msgs []*driver.Message
	for i := range unique {
		id := "m-" + strconv.Itoa(i)
		msgs = append(msgs, &driver.Message{ID: id, Body: []byte(id)})
		switch i % 10 {
		case 4:
			msgs = append(msgs, &driver.Message{ID: id, Body: []byte(id)})
		case 9:
			dup := "m-" + strconv.Itoa((i+unique/2)%unique)
			msgs = append(msgs, &driver.Message{ID: dup, Body: []byte(dup)})
		}
	}
	produce(t, bs, topic, msgs...)
	url := shareURL(bs, topic, group, "")
	openShare(t, url).Close() // sets the group's share.auto.offset.reset once

	cfg := func(name string) killConfig {
		return killConfig{Source: url, Postgres: pgURL, Inbox: inbox, Effects: effects, Member: name}
	}
	members := []*killMember{startKillMember(t, cfg("a")), startKillMember(t, cfg("b")), startKillMember(t, cfg("c"))}
	count := func(q string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	failWith := func(format string, args ...any) {
		t.Helper()
		for _, m := range members {
			t.Logf("member %s stderr:\n%s", m.name, m.stderrTail())
		}
		t.Fatalf(format, args...)
	}
	alive := func() {
		t.Helper()
		for _, m := range members {
			if m.exited() && m.err != nil && !errors.Is(m.err, errKilled) {
				failWith("member %s exited: %v", m.name, m.err)
			}
		}
	}

	// Kill the member holding the most records in decision once a third
	// of the ids are applied.
	start := time.Now()
	var victim *killMember
	deadline := time.Now().Add(60 * time.Second)
	for victim == nil {
		if time.Now().After(deadline) {
			failWith("timed out waiting for a third of the effects")
		}
		alive()
		if count("SELECT count(*) FROM "+effects) >= unique/3 {
			for _, m := range members {
				if n := len(m.inflightOffsets()); n > 0 && (victim == nil || n > len(victim.inflightOffsets())) {
					victim = m
				}
			}
		}
		if victim == nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	killedAt := time.Since(start)
	victim.err = markKilled(victim.err)
	held := victim.inflightOffsets()
	byVictim := count("SELECT count(*) FROM " + effects + " WHERE member = '" + victim.name + "'")
	atKill := count("SELECT count(*) FROM " + effects)
	t.Logf("killed member %s at %v with %d decisions under way (offsets %v); %d effects committed, %d of them by it",
		victim.name, killedAt.Round(time.Millisecond), len(held), held, atKill, byVictim)
	if len(held) == 0 {
		t.Errorf("member %s held no records when it was killed", victim.name)
	}
	members = append(members, startKillMember(t, cfg("d")))

	// Every id applied, every offset the victim held decided again by
	// another member, and nothing more coming for a second past the
	// victim's locks.
	settled := func() bool {
		if count("SELECT count(DISTINCT id) FROM "+effects) < unique {
			return false
		}
		if time.Since(start) < killedAt+testLock+time.Second {
			return false
		}
		redecided := map[int]bool{}
		decided := map[int]bool{}
		var last time.Time
		for _, m := range members {
			for _, d := range m.decisions() {
				decided[d.offset] = true
				if m != victim {
					redecided[d.offset] = true
				}
			}
			m.mu.Lock()
			if m.lastLine.After(last) {
				last = m.lastLine
			}
			m.mu.Unlock()
		}
		for _, off := range held {
			if !redecided[off] {
				return false
			}
		}
		return len(decided) == len(msgs) && time.Since(last) > time.Second
	}
	for !settled() {
		if time.Now().After(deadline) {
			failWith("timed out: %d of %d ids applied", count("SELECT count(DISTINCT id) FROM "+effects), unique)
		}
		alive()
		time.Sleep(50 * time.Millisecond)
	}

	for _, m := range members {
		if m != victim {
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, m := range members {
		if m == victim {
			continue
		}
		select {
		case <-m.done:
		case <-time.After(20 * time.Second):
			failWith("member %s did not stop on SIGTERM", m.name)
		}
		if m.err != nil {
			failWith("member %s: %v", m.name, m.err)
		}
	}
	elapsed := time.Since(start)

	// The effects: each of the ids exactly once.
	rows, err := pool.Query(ctx, "SELECT id, count(*) FROM "+effects+" GROUP BY id HAVING count(*) > 1 ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var twice []string
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		twice = append(twice, fmt.Sprintf("%s×%d", id, n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	total, distinct := count("SELECT count(*) FROM "+effects), count("SELECT count(DISTINCT id) FROM "+effects)
	wanted := count("SELECT count(*) FROM " + effects + " WHERE id ~ '^m-[0-9]+$' AND substr(id, 3)::int BETWEEN 0 AND " + strconv.Itoa(unique-1))
	if len(twice) > 0 {
		t.Errorf("ids applied more than once: %v", twice)
	}
	if total != unique || distinct != unique || wanted != unique {
		t.Errorf("effects: %d rows for %d distinct ids (%d of them m-0..m-%d), want each of the %d ids exactly once",
			total, distinct, wanted, unique-1, unique)
	}

	// The deliveries: what each member decided, and what became of the
	// records the victim held.
	decidedBy := map[int][]string{}
	var processed, duplicates, redelivered int
	for _, m := range members {
		for _, d := range m.decisions() {
			decidedBy[d.offset] = append(decidedBy[d.offset], fmt.Sprintf("%s:%s@%d", m.name, d.decision, d.attempt))
			switch d.decision {
			case core.Processed.String():
				processed++
			case core.Duplicate.String():
				duplicates++
			}
			if d.attempt > 1 {
				redelivered++
			}
		}
		if m != victim {
			m.mu.Lock()
			t.Logf("member %s: %d decisions, stats %+v", m.name, len(m.ends), m.stats)
			m.mu.Unlock()
		} else {
			t.Logf("member %s (killed): %d decisions before the kill", m.name, len(m.decisions()))
		}
	}
	var fates []string
	for _, off := range held {
		fates = append(fates, fmt.Sprintf("%d→%v", off, decidedBy[off]))
	}
	t.Logf("%d records, %d decided Processed, %d Duplicate, %d on a redelivery; the victim's held records: %s; %v in all",
		len(msgs), processed, duplicates, redelivered, strings.Join(fates, " "), elapsed.Round(time.Millisecond))
	for _, off := range held {
		again := false
		for _, s := range decidedBy[off] {
			if !strings.HasPrefix(s, victim.name+":") && !strings.HasSuffix(s, "@1") {
				again = true
			}
		}
		if !again {
			t.Errorf("offset %d, held by the killed member, was not delivered again to another member: %v", off, decidedBy[off])
		}
	}
	if duplicates < len(msgs)-unique {
		t.Errorf("%d deliveries decided Duplicate, want at least the %d published duplicates", duplicates, len(msgs)-unique)
	}
}

// errKilled marks the victim's exit by SIGKILL as expected.
var errKilled = errors.New("killed by the test")

// markKilled turns the victim's Wait error into errKilled when the process
// died of SIGKILL, and keeps any other.
func markKilled(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return errKilled
		}
	}
	return err
}
