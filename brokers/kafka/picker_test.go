package kafka

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// picker is what the Source asks of a partition's waiting messages; both
// the partition and refPicker implement it so they can be compared.
type picker interface {
	fetched(e *entry)
	pick(now time.Time) *entry
	recall(e *entry)
	settled(e *entry, retry bool)
}

// refPicker is the straightforward picker the lanes replaced: one list of
// waiting entries in offset order, scanned for the first one the ordering
// allows. It is the specification the partition's picker is checked
// against, and the "before" of BenchmarkPick.
type refPicker struct {
	order   Ordering
	early   bool     // a key's messages go out before the earlier are settled
	waiting []*entry // fetched (or retried) and not handed out, in offset order
	out     int      // entries handed out
	busy    map[string]int
	// early: the entries out, those recalled, and how many of each key
	outs     map[*entry]bool
	recalled map[*entry]bool
	recalls  map[string]int
}

func newRefPicker(o Ordering) *refPicker {
	return &refPicker{order: o, busy: map[string]int{}, outs: map[*entry]bool{}, recalled: map[*entry]bool{}, recalls: map[string]int{}}
}

// recall blocks e's key until the entries of its key out above e are
// back (early).
func (p *refPicker) recall(e *entry) {
	if !p.early || len(e.r.Key) == 0 {
		return
	}
	for x := range p.outs {
		if string(x.r.Key) == string(e.r.Key) && x.r.Offset > e.r.Offset && !p.recalled[x] {
			p.recalled[x] = true
			p.recalls[string(e.r.Key)]++
		}
	}
}

func (p *refPicker) fetched(e *entry) { p.waiting = append(p.waiting, e) }

func (p *refPicker) pick(now time.Time) *entry {
	take := func(i int) *entry {
		e := p.waiting[i]
		p.waiting = slices.Delete(p.waiting, i, i+1)
		p.out++
		p.outs[e] = true
		if len(e.r.Key) > 0 {
			p.busy[string(e.r.Key)]++
		}
		return e
	}
	switch p.order {
	case OrderPerPartition:
		if p.out > 0 || len(p.waiting) == 0 || p.waiting[0].notBefore.After(now) {
			return nil
		}
		return take(0)
	case OrderNone:
		for i, e := range p.waiting {
			if !e.notBefore.After(now) {
				return take(i)
			}
		}
		return nil
	}
	var blocked map[string]bool
	for i, e := range p.waiting {
		ready := !e.notBefore.After(now)
		if len(e.r.Key) == 0 {
			if ready {
				return take(i)
			}
			continue
		}
		k := string(e.r.Key)
		if (p.busy[k] > 0 && !p.early) || p.recalls[k] > 0 || blocked[k] {
			continue
		}
		if ready {
			return take(i)
		}
		if blocked == nil {
			blocked = make(map[string]bool)
		}
		blocked[k] = true
	}
	return nil
}

func (p *refPicker) settled(e *entry, retry bool) {
	p.out--
	delete(p.outs, e)
	if p.recalled[e] {
		delete(p.recalled, e)
		p.recalls[string(e.r.Key)]--
	}
	if len(e.r.Key) > 0 {
		k := string(e.r.Key)
		if p.busy[k]--; p.busy[k] <= 0 {
			delete(p.busy, k)
		}
	}
	if retry {
		i, _ := slices.BinarySearchFunc(p.waiting, e.r.Offset, func(x *entry, off int64) int {
			return cmp.Compare(x.r.Offset, off)
		})
		p.waiting = slices.Insert(p.waiting, i, e)
	}
}

// pickerFixture drives a picker the way the Source does, by offset.
type pickerFixture struct {
	t    *testing.T
	p    picker
	now  time.Time
	next int64
	all  map[int64]*entry
}

func newFixture(t *testing.T, p picker) *pickerFixture {
	return &pickerFixture{t: t, p: p, now: time.Unix(1_000_000, 0), all: map[int64]*entry{}}
}

// fetch adds the next offsets with these keys ("" is keyless).
func (f *pickerFixture) fetch(keys ...string) {
	for _, k := range keys {
		f.fetchAt(k, time.Time{})
	}
}

// fetchAt adds the next offset with key k, not to go before notBefore (a
// retry-topic copy).
func (f *pickerFixture) fetchAt(k string, notBefore time.Time) {
	e := &entry{r: &kgo.Record{Offset: f.next}, notBefore: notBefore}
	if k != "" {
		e.r.Key = []byte(k)
	}
	f.all[f.next] = e
	f.next++
	if p, ok := f.p.(*partition); ok {
		p.entries = append(p.entries, e)
	}
	f.p.fetched(e)
}

// pick hands out one entry, as the Source does, or returns nil.
func (f *pickerFixture) pick() *entry {
	e := f.p.pick(f.now)
	if e != nil {
		e.state = handed
	}
	return e
}

// picks hands out entries until none may go and returns their offsets.
func (f *pickerFixture) picks() []int64 {
	var got []int64
	for e := f.pick(); e != nil; e = f.pick() {
		got = append(got, e.r.Offset)
	}
	return got
}

func (f *pickerFixture) expect(want ...int64) {
	f.t.Helper()
	if got := f.picks(); !slices.Equal(got, want) {
		f.t.Fatalf("picked %v, want %v", got, want)
	}
}

func (f *pickerFixture) done(offs ...int64) {
	for _, off := range offs {
		f.all[off].state = done
		f.p.settled(f.all[off], false)
	}
}

// retry retries off, as Source.Retry does: it recalls what of its key
// went out after it.
func (f *pickerFixture) retry(off int64, delay time.Duration) {
	e := f.all[off]
	f.p.recall(e)
	e.state, e.notBefore = waiting, f.now.Add(delay)
	f.p.settled(e, true)
}

// release gives off back at once, as Source.Release does.
func (f *pickerFixture) release(off int64) {
	e := f.all[off]
	e.state, e.notBefore = waiting, time.Time{}
	f.p.settled(e, true)
}

func TestPickPerKeyOrder(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerKey})
	f.fetch("a", "b", "a", "b", "c", "a", "c")
	f.expect(0, 1, 4) // one per key, the first of each
	f.done(4)
	f.expect(6)
	f.done(1)
	f.expect(3)
	f.done(0)
	f.expect(2)
	f.done(2)
	f.expect(5)
	f.done(3, 5, 6)
	f.expect()
	f.fetch("a", "b")
	f.expect(7, 8) // freed lanes are recreated
}

func TestPickRetriedHeadBlocksItsKeyOnly(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerKey})
	f.fetch("a", "a", "b", "b")
	f.expect(0, 2)
	f.retry(0, 10*time.Millisecond)
	f.done(2)
	f.expect(3) // a's head waits for its retry; b goes on
	f.now = f.now.Add(10 * time.Millisecond)
	f.expect(0)
	f.retry(0, 0)
	f.expect(0) // a zero delay is due at once
	f.done(0)
	f.expect(1)

	// A retry-topic copy not yet due holds the later ones of its key.
	g := newFixture(t, &partition{order: OrderPerKey})
	g.fetchAt("a", g.now.Add(time.Second))
	g.fetch("a", "b")
	g.expect(2)
	g.now = g.now.Add(time.Second)
	g.expect(0)
}

func TestPickKeyless(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerKey})
	f.fetch("a", "a", "", "")
	f.fetchAt("", f.now.Add(time.Second))
	f.fetch("")
	f.expect(0, 2, 3, 5) // keyless go together; a delayed one holds no one
	f.retry(2, time.Second)
	f.now = f.now.Add(time.Second)
	f.expect(2, 4)
}

func TestPickLowestOffsetFirst(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerKey})
	f.fetch("a", "b", "a", "c", "", "b")
	f.expect(0, 1, 3, 4)
	f.done(1, 0) // b's 5 and a's 2 may go: 2 first
	f.expect(2, 5)
	f.fetch("d")
	f.fetchAt("e", f.now.Add(time.Millisecond))
	f.fetch("f")
	f.retry(3, 0)
	f.now = f.now.Add(time.Millisecond)
	f.expect(3, 6, 7, 8) // the due ones merge in offset order
}

func TestPickPerPartition(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerPartition})
	f.fetch("a", "b", "", "a")
	f.expect(0)
	f.done(0)
	f.expect(1)
	f.retry(1, time.Second)
	f.expect() // the retried head holds the partition
	f.now = f.now.Add(time.Second)
	f.expect(1)
	f.done(1)
	f.expect(2)
	f.done(2)
	f.expect(3)
	f.done(3)
	f.expect()
}

func TestPickOrderNone(t *testing.T) {
	f := newFixture(t, &partition{order: OrderNone})
	f.fetch("a", "a")
	f.fetchAt("b", f.now.Add(time.Second))
	f.fetch("b", "")
	f.expect(0, 1, 3, 4)
	f.retry(1, time.Second)
	f.fetch("a")
	f.expect(5)
	f.now = f.now.Add(time.Second)
	f.expect(1, 2)
}

func TestPickRequeueReinserts(t *testing.T) {
	f := newFixture(t, &partition{order: OrderPerKey})
	f.fetch("a", "a")
	f.expect(0)
	// Enough fetches behind the out head that the lane compacts away the
	// slot it was popped from; the retry must still go first.
	for range 100 {
		f.fetch("a")
	}
	f.retry(0, time.Millisecond)
	f.expect()
	f.now = f.now.Add(time.Millisecond)
	f.expect(0)
	f.done(0)
	for off := int64(1); off <= 101; off++ {
		f.expect(off)
		if off%3 == 0 {
			f.retry(off, 0)
			f.expect(off)
		}
		f.done(off)
	}
	f.expect()

	// lane.insert keeps offset order wherever the entry lands.
	var l lane
	for _, off := range []int64{5, 1, 9, 3, 7} {
		l.insert(&entry{r: &kgo.Record{Offset: off}})
	}
	l.popFront()
	l.insert(&entry{r: &kgo.Record{Offset: 0}})
	var got []int64
	for l.len() > 0 {
		got = append(got, l.front().r.Offset)
		l.popFront()
	}
	if want := []int64{0, 3, 5, 7, 9}; !slices.Equal(got, want) {
		t.Fatalf("lane order %v, want %v", got, want)
	}
}

// TestPickMatchesReference runs random fetches, picks, settlements,
// retries and clock steps against both the lanes and the scanning
// reference, and requires the same pick every time.
func TestPickMatchesReference(t *testing.T) {
	for _, o := range []Ordering{OrderPerKey, OrderPerPartition, OrderNone} {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("%v/%d", o, seed), func(t *testing.T) {
				comparePickers(t, o, false, seed, 5000)
			})
		}
	}
	// Early: a key's next messages go out while earlier ones are out,
	// never past a waiting earlier one, retried ones included.
	for seed := range uint64(20) {
		t.Run(fmt.Sprintf("early/%d", seed), func(t *testing.T) {
			comparePickers(t, OrderPerKey, true, seed, 5000)
		})
	}
}

func comparePickers(t *testing.T, o Ordering, early bool, seed uint64, ops int) {
	rnd := rand.New(rand.NewPCG(seed, 42))
	nkeys := 1 + rnd.IntN(12)
	p := &partition{order: o, early: early}
	ref := newRefPicker(o)
	ref.early = early
	got, want := newFixture(t, p), newFixture(t, ref)
	var outs []int64
	for i := range ops {
		switch r := rnd.IntN(100); {
		case r < 30: // fetch, sometimes keyless, sometimes a retry copy
			k := ""
			if rnd.IntN(5) > 0 {
				k = fmt.Sprintf("k%d", rnd.IntN(nkeys))
			}
			var nb time.Time
			if rnd.IntN(10) == 0 {
				nb = got.now.Add(time.Duration(rnd.IntN(6)) * time.Millisecond)
			}
			got.fetchAt(k, nb)
			want.fetchAt(k, nb)
		case r < 60: // pick
			g, w := got.pick(), want.pick()
			if (g == nil) != (w == nil) || (g != nil && g.r.Offset != w.r.Offset) {
				t.Fatalf("op %d: picked %s, reference %s", i, pickedOffset(g), pickedOffset(w))
			}
			if g != nil {
				outs = append(outs, g.r.Offset)
			}
		case r < 90: // settle a random out message, a third of them retried
			if len(outs) == 0 {
				continue
			}
			j := rnd.IntN(len(outs))
			off := outs[j]
			outs = slices.Delete(outs, j, j+1)
			switch rnd.IntN(6) {
			case 0, 1:
				d := time.Duration(rnd.IntN(6)) * time.Millisecond
				got.retry(off, d)
				want.retry(off, d)
			case 2:
				got.release(off)
				want.release(off)
			default:
				got.done(off)
				want.done(off)
			}
		default:
			d := time.Duration(rnd.IntN(3)) * time.Millisecond
			got.now = got.now.Add(d)
			want.now = want.now.Add(d)
		}
	}
	// Drain: everything left comes out in the same order, and then the
	// lanes are gone.
	got.now = got.now.Add(time.Hour)
	want.now = want.now.Add(time.Hour)
	for {
		g, w := got.picks(), want.picks()
		if !slices.Equal(g, w) {
			t.Fatalf("drain: picked %v, reference %v", g, w)
		}
		outs = append(outs, g...)
		if len(outs) == 0 {
			break
		}
		got.done(outs...)
		want.done(outs...)
		outs = outs[:0]
	}
	if len(p.lanes) != 0 || len(p.ready) != 0 || p.fresh.len() != 0 || len(p.delayed) != 0 || (p.one != nil && (p.one.out > 0 || p.one.len() > 0)) {
		t.Fatalf("left over: %d lanes, %d ready, %d delayed", len(p.lanes), len(p.ready), len(p.delayed))
	}
}

func pickedOffset(e *entry) string {
	if e == nil {
		return "nothing"
	}
	return fmt.Sprint(e.r.Offset)
}

// BenchmarkPick measures one settle + fetch + pick cycle of a partition
// under OrderPerKey with 2,000 messages waiting over 1,000 keys and 800 out
// (most waiting ones behind a busy key): "scan" is the old picker
// (refPicker), "lanes" the partition's.
func BenchmarkPick(b *testing.B) {
	const nkeys, nwaiting, nout = 1000, 2000, 800
	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	for _, impl := range []struct {
		name string
		new  func() picker
	}{
		{"scan", func() picker { return newRefPicker(OrderPerKey) }},
		{"lanes", func() picker { return &partition{order: OrderPerKey} }},
	} {
		b.Run(impl.name, func(b *testing.B) {
			rnd := rand.New(rand.NewPCG(1, 2))
			p := impl.new()
			now := time.Unix(1_000_000, 0)
			var off int64
			fetch := func() {
				p.fetched(&entry{r: &kgo.Record{Offset: off, Key: keys[rnd.IntN(nkeys)]}})
				off++
			}
			var outs []*entry
			for range nwaiting + nout {
				fetch()
			}
			for len(outs) < nout {
				e := p.pick(now)
				if e == nil {
					b.Fatalf("only %d of %d could go out", len(outs), nout)
				}
				outs = append(outs, e)
			}
			b.ResetTimer()
			for range b.N {
				if len(outs) > 0 {
					p.settled(outs[0], false)
					outs = outs[1:]
				}
				fetch()
				if e := p.pick(now); e != nil {
					outs = append(outs, e)
				}
			}
		})
	}
}

// TestPickEarlyRecall: early, a retried message closes its key's lane
// until the later messages of its key that were out come back, whatever
// order they come back in, so none goes out again ahead of an earlier one.
func TestPickEarlyRecall(t *testing.T) {
	p := &partition{order: OrderPerKey, early: true}
	f := newFixture(t, p)
	f.fetch("a", "a", "b", "a")
	f.expect(0, 1, 2, 3) // a key's messages go out without waiting
	f.retry(0, 0)
	f.expect() // 1 and 3 are still out: nothing of a goes
	f.release(3)
	f.expect() // 1 is still out: 3 must not go ahead of it
	f.release(1)
	f.expect(0, 1, 3)
	f.done(0, 1, 2, 3)
	f.expect()
}
