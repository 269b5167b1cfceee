package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// owned returns the partitions s holds and is not giving up, as
// "topic/id", sorted.
func owned(s *Source) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.ring {
		out = append(out, p.topic+"/"+p.idText)
	}
	slices.Sort(out)
	return out
}

// member is one replica of a service in a group: a Source and the
// Consumer over it, booking into e.
type member struct {
	src *Source
	c   *consumer
	cut *cutter
}

// memberOpts are the options of the membership tests' replicas: a commit
// every 50ms, a session of 6s (a restart comes well within it), and the
// group protocol.
func memberOpts(protocol GroupProtocol, logger *slog.Logger) []Option {
	return []Option{WithGroupTimeouts(6*time.Second, 100*time.Millisecond, 10*time.Second), WithRevokeTimeout(2 * time.Second),
		WithCommit(50*time.Millisecond, 100), WithLogger(logger), WithGroupProtocol(protocol)}
}

// startMember starts a replica with instance id id ("" for a dynamic
// member) on topic in group, booking with h (nil: e.apply).
func startMember(t *testing.T, bs, topic, group, id string, protocol GroupProtocol, e *pgEffects, logger *slog.Logger, h core.Handler[pgx.Tx]) *member {
	t.Helper()
	m := &member{cut: &cutter{}}
	opts := append(memberOpts(protocol, logger), WithTopic(topic), WithGroup(group), m.cut.option())
	if id != "" {
		opts = append(opts, WithInstanceID(id))
	}
	src, err := Open(context.Background(), bs, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	m.src = src
	m.c = startConsumer(t, src, e, h, core.WithBatchSize(50), core.WithConcurrency(2), core.WithWindow(200), core.WithLogger(logger))
	return m
}

// kill stops m as SIGKILL does: its connections are cut first, so it
// neither commits nor leaves; its shutdown goes on in the background.
func (m *member) kill() {
	m.cut.kill()
	m.c.stop()
}

// stream publishes payments (one in five a copy of an earlier one) to
// topic in chunks until stop is closed, and returns the unique ids sent.
func stream(t *testing.T, bs, topic string, chunk int, every time.Duration, stop <-chan struct{}) (ids func() []string, done <-chan struct{}) {
	pub, err := NewPublisher(context.Background(), bs)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sent []string
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		defer pub.Close()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			msgs := make([]*driver.Message, chunk)
			mu.Lock()
			for i := range msgs {
				if len(sent) > 0 && rand.IntN(5) == 0 {
					id := sent[rand.IntN(len(sent))]
					msgs[i] = &driver.Message{ID: id, Body: []byte(id)}
					continue
				}
				id := fmt.Sprintf("pay-%06d", n)
				n++
				sent = append(sent, id)
				msgs[i] = &driver.Message{ID: id, Body: []byte(id)}
			}
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := pub.Publish(ctx, topic, msgs...)
			cancel()
			if err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sent)
	}, fin
}

// checkOnce fails unless e holds each of ids' effects exactly once.
func checkOnce(t *testing.T, e *pgEffects, ids []string) {
	t.Helper()
	rows, distinct := e.counts(t)
	if distinct != len(ids) || rows != distinct {
		t.Errorf("%d effects for %d distinct ids, want each of the %d ids once (twice: %v)", rows, distinct, len(ids), e.twice(t, e.store.Pool()))
	}
}

// A rolling restart of three static members (each closed and started
// again with its instance id, one after the other, while payments flow):
// no member ever gives up a partition but the one restarting, each gets
// back the partitions it had, and every payment is applied once.
func TestRollingRestartOfStaticMembersMovesNoPartitionOfTheOthers(t *testing.T) {
	for _, protocol := range []GroupProtocol{ProtocolClassic, ProtocolConsumer} {
		t.Run(map[GroupProtocol]string{ProtocolClassic: "classic", ProtocolConsumer: "consumer"}[protocol], func(t *testing.T) {
			e := newPGEffects(t)
			bs := brokers(t)
			const parts = 6
			topic := newTopic(t, bs, parts)
			group := "g-" + randomHex(4)
			stop := make(chan struct{})
			ids, published := stream(t, bs, topic, 20, 20*time.Millisecond, stop)
			members := make([]*member, 3)
			for i := range members {
				members[i] = startMember(t, bs, topic, group, "replica-"+strconv.Itoa(i), protocol, e, testLogger(t), nil)
			}
			before := make([][]string, 3)
			servicetest.WaitFor(t, 60*time.Second, "every member to own two partitions", func() bool {
				for i, m := range members {
					if before[i] = owned(m.src); len(before[i]) != parts/3 {
						return false
					}
				}
				return true
			})
			t.Logf("assignment: %v", before)
			for i := range members {
				others := map[int]Stats{}
				for j, m := range members {
					if j != i {
						others[j] = m.src.Stats()
					}
				}
				members[i].c.shutdown(t) // a graceful stop: a static member leaves no group
				members[i] = startMember(t, bs, topic, group, "replica-"+strconv.Itoa(i), protocol, e, testLogger(t), nil)
				servicetest.WaitFor(t, 60*time.Second, fmt.Sprintf("replica-%d to own its partitions again", i), func() bool {
					return slices.Equal(owned(members[i].src), before[i])
				})
				for j, st := range others {
					if now := members[j].src.Stats(); now.Revoked != st.Revoked || now.Assigned != st.Assigned {
						t.Errorf("replica-%d's restart moved replica-%d's partitions: revoked %d, assigned %d (before: %d, %d)", i, j, now.Revoked, now.Assigned, st.Revoked, st.Assigned)
					}
					if got := owned(members[j].src); !slices.Equal(got, before[j]) {
						t.Errorf("after replica-%d's restart replica-%d owns %v, had %v", i, j, got, before[j])
					}
				}
			}
			close(stop)
			<-published
			servicetest.WaitFor(t, 60*time.Second, "every payment committed by the group", func() bool { return drained(t, bs, group, topic, parts) })
			for _, m := range members {
				m.c.shutdown(t)
			}
			checkOnce(t, e, ids())
		})
	}
}

// One of three static members crash-loops (its connections cut, as by
// SIGKILL, and a new process with its instance id started at once) every
// 6-12 s while the group drains a backlog whose handler takes a
// millisecond a payment: the other two go on committing between every two
// kills while their partitions have records left, every payment is applied once, and the drain takes at most twice
// as long as the same drain undisturbed (the bound is the behaviour under
// test; both times are measured from the start of consuming to the group's
// last commit, on this machine in the same test). With the classic
// protocol, a static member's restart takes its partitions back at once
// and the others never give one up; with KIP-848 the broker holds a
// crashed static member's partitions until its session (2s here) times
// out, and they move meanwhile.
func TestCrashLoopingMemberDoesNotStopTheGroup(t *testing.T) {
	for _, protocol := range []GroupProtocol{ProtocolClassic, ProtocolConsumer} {
		t.Run(map[GroupProtocol]string{ProtocolClassic: "classic", ProtocolConsumer: "consumer"}[protocol], func(t *testing.T) {
			bs := brokers(t)
			const parts, n = 6, 40000
			drain := func(t *testing.T, loop bool) (time.Duration, int) {
				e := newPGEffects(t)
				topic := newTopic(t, bs, parts)
				group := "g-" + randomHex(4)
				msgs := publishN(t, bs, topic, "pay", n, func(i int) string { return "acct-" + strconv.Itoa(i%97) })
				work := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
					time.Sleep(time.Millisecond)
					return e.apply(ctx, tx, m)
				}
				quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // killed members go on logging after the test
				start := time.Now()
				members := make([]*member, 3)
				for i := range members {
					members[i] = startMember(t, bs, topic, group, "replica-"+strconv.Itoa(i), protocol, e, quiet, work)
				}
				servicetest.WaitFor(t, 30*time.Second, "every member to own two partitions", func() bool {
					return len(owned(members[0].src)) == 2 && len(owned(members[1].src)) == 2 && len(owned(members[2].src)) == 2
				})
				settled := []Stats{members[0].src.Stats(), members[1].src.Stats()}
				kills, last := 0, slices.Clone(settled)
				// waiting[i] are the partitions replica i owned with records
				// left to commit at the last kill: a member that still owns
				// one of them at the next kill must have committed meanwhile
				// (a member whose partitions are drained has nothing to do).
				waiting := make([][]string, 2)
				next := time.Now().Add(6*time.Second + rand.N(6*time.Second))
				for !drained(t, bs, group, topic, parts) {
					if time.Since(start) > 3*time.Minute {
						t.Fatalf("not drained within 3 minutes (%d kills)", kills)
					}
					if loop && time.Now().After(next) {
						ends, done := endOffsets(t, bs, topic, parts), committed(t, bs, group, topic, parts)
						for i, m := range members[:2] {
							st, now := m.src.Stats(), owned(m.src)
							held := slices.DeleteFunc(slices.Clone(waiting[i]), func(p string) bool { return !slices.Contains(now, p) })
							if kills > 0 && st.Commits == last[i].Commits && len(held) > 0 {
								t.Errorf("replica-%d committed nothing between kills %d and %d, with records left on %v", i, kills, kills+1, held)
							}
							last[i], waiting[i] = st, nil
							for _, p := range now {
								id, _ := strconv.Atoi(p[strings.LastIndexByte(p, '/')+1:])
								if done[id] < ends[id] {
									waiting[i] = append(waiting[i], p)
								}
							}
						}
						members[2].kill()
						members[2] = startMember(t, bs, topic, group, "replica-2", protocol, e, quiet, work)
						kills++
						next = time.Now().Add(6*time.Second + rand.N(6*time.Second))
					}
					time.Sleep(20 * time.Millisecond)
				}
				took := time.Since(start)
				for i, m := range members[:2] {
					if st := m.src.Stats(); protocol == ProtocolClassic && st.Revoked != settled[i].Revoked {
						t.Errorf("replica-%d gave up %d partitions while replica-2 crash-looped", i, st.Revoked-settled[i].Revoked)
					}
				}
				for _, m := range members {
					m.c.shutdown(t)
				}
				checkOnce(t, e, msgIDs(msgs))
				return took, kills
			}
			var base, looped time.Duration
			var kills int
			t.Run("undisturbed", func(t *testing.T) { base, _ = drain(t, false) })
			t.Run("crash-loop", func(t *testing.T) { looped, kills = drain(t, true) })
			t.Logf("drained %d payments in %v undisturbed, %v with replica-2 killed %d times (ratio %.2f)", n, base.Round(time.Millisecond), looped.Round(time.Millisecond), kills, looped.Seconds()/base.Seconds())
			if kills < 1 {
				t.Errorf("the drain ended before the crash loop's first kill; make the backlog bigger")
			}
			if looped > 2*base {
				t.Errorf("the drain took %v under the crash loop, more than twice the %v undisturbed", looped, base)
			}
		})
	}
}

// msgIDs returns the distinct ids of msgs.
func msgIDs(msgs []*driver.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// commitTimes samples s's commit count until stop is closed and returns
// when each new commit was seen.
func commitTimes(s *Source, stop <-chan struct{}) func() []time.Time {
	var mu sync.Mutex
	var times []time.Time
	go func() {
		last := s.Stats().Commits
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if c := s.Stats().Commits; c != last {
				last = c
				mu.Lock()
				times = append(times, time.Now())
				mu.Unlock()
			}
		}
	}()
	return func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(times)
	}
}

// maxGap is the longest time in [from, to] without a time of ts.
func maxGap(ts []time.Time, from, to time.Time) time.Duration {
	gap, last := time.Duration(0), from
	for _, t := range ts {
		if t.After(from) && t.Before(to) {
			gap, last = max(gap, t.Sub(last)), t
		}
	}
	return max(gap, to.Sub(last))
}

// A member joining a KIP-848 group takes its share of the partitions
// while the two members already there go on committing: neither goes a
// second without a commit (their commit interval is 50ms, and payments
// arrive on every partition all the time; the bound is the behaviour under
// test), each gives up only partitions the newcomer takes, and every
// payment is applied once.
func TestConsumerProtocolJoinDoesNotStopTheOthers(t *testing.T) {
	e := newPGEffects(t)
	bs := brokers(t)
	const parts = 6
	topic := newTopic(t, bs, parts)
	group := "g-" + randomHex(4)
	stop := make(chan struct{})
	ids, published := stream(t, bs, topic, 12, 20*time.Millisecond, stop)
	a := startMember(t, bs, topic, group, "", ProtocolConsumer, e, testLogger(t), nil)
	b := startMember(t, bs, topic, group, "", ProtocolConsumer, e, testLogger(t), nil)
	servicetest.WaitFor(t, 60*time.Second, "the two members to split the partitions", func() bool {
		return len(owned(a.src)) == parts/2 && len(owned(b.src)) == parts/2
	})
	sampling := make(chan struct{})
	ta, tb := commitTimes(a.src, sampling), commitTimes(b.src, sampling)
	revoked := a.src.Stats().Revoked + b.src.Stats().Revoked
	time.Sleep(time.Second) // commits before the join, to measure against
	joinAt := time.Now()
	c := startMember(t, bs, topic, group, "", ProtocolConsumer, e, testLogger(t), nil)
	servicetest.WaitFor(t, 60*time.Second, "the newcomer to take its share", func() bool {
		return len(owned(c.src)) == parts/3 && len(owned(a.src)) == parts/3 && len(owned(b.src)) == parts/3
	})
	joined := time.Now()
	time.Sleep(time.Second) // and after it
	close(sampling)
	for name, ts := range map[string][]time.Time{"a": ta(), "b": tb()} {
		gap := maxGap(ts, joinAt.Add(-time.Second), joined.Add(time.Second))
		t.Logf("member %s: longest time without a commit around the join: %v (join took %v)", name, gap.Round(time.Millisecond), joined.Sub(joinAt).Round(time.Millisecond))
		if gap > time.Second {
			t.Errorf("member %s went %v without a commit while the newcomer joined", name, gap)
		}
	}
	if got := a.src.Stats().Revoked + b.src.Stats().Revoked - revoked; got != parts/3 {
		t.Errorf("the members gave up %d partitions, want the %d the newcomer took", got, parts/3)
	}
	close(stop)
	<-published
	servicetest.WaitFor(t, 60*time.Second, "every payment committed by the group", func() bool { return drained(t, bs, group, topic, parts) })
	for _, m := range []*member{a, b, c} {
		m.c.shutdown(t)
	}
	checkOnce(t, e, ids())
}

// Records produced with kcat (librdkafka), as a service in another
// language would, read by a consumer group: the id comes from the
// message-id header, the key and body as written; a record kcat sent
// without the header is refused an id (the Consumer dead-letters it).
func TestProducedWithKcat(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	kcatProduce(t, bs, topic)
	_, r := startSource(t, bs, topic, "g-"+randomHex(4), 0, WithOrdering(OrderNone))
	checkKcat(t, r)
}
