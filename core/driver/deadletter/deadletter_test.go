package deadletter_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// shelf is a Store over a slice, with errors to inject.
type shelf struct {
	parked     []*admin.Parked
	published  []*admin.Parked
	failPub    string // the Ref whose Republish fails
	failRemove string // the Ref whose Remove fails
	closed     bool
}

func (s *shelf) Name() string { return "orders.dlq" }
func (s *shelf) Close() error { s.closed = true; return nil }

func (s *shelf) Each(ctx context.Context, fn func(ref int, p *admin.Parked) error) error {
	for i, p := range slices.Clone(s.parked) {
		if p.Ref == "removed" {
			continue
		}
		if err := fn(i, p); err != nil {
			return err
		}
	}
	return nil
}

func (s *shelf) Republish(_ context.Context, _ int, p *admin.Parked) error {
	if p.Ref == s.failPub {
		return errors.New("nack")
	}
	s.published = append(s.published, p)
	return nil
}

func (s *shelf) Remove(_ context.Context, ref int) error {
	p := s.parked[ref]
	if p.Ref == s.failRemove {
		return errors.New("gone away")
	}
	s.parked[ref] = &admin.Parked{Ref: "removed"}
	return nil
}

func (s *shelf) refs() (out []string) {
	for _, p := range s.parked {
		if p.Ref != "removed" {
			out = append(out, p.Ref)
		}
	}
	return out
}

func newShelf() *shelf {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	var s shelf
	for i, id := range []string{"a", "b", "c", ""} {
		m := deadletter.Mark{Cause: "boom " + id, Attempt: i + 1, Origin: "orders/7", Destination: "orders", At: at}
		h := m.Headers()
		h["tenant"] = "t1"
		p := &admin.Parked{Ref: string(rune('1' + i)), ID: id, Headers: h, ParkedAt: at.Add(time.Minute)}
		deadletter.Read(p)
		s.parked = append(s.parked, p)
	}
	return &s
}

func TestMarkRead(t *testing.T) {
	s := newShelf()
	p := s.parked[1]
	if p.Cause != "boom b" || p.Attempt != 2 || p.Origin != "orders/7" || p.Destination != "orders" {
		t.Fatalf("read %+v", p)
	}
	if want := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC); !p.ParkedAt.Equal(want) {
		t.Fatalf("ParkedAt %v, want the earlier header time %v", p.ParkedAt, want)
	}
	if h := (deadletter.Mark{Cause: "x"}).Headers(); len(h) != 1 || h[driver.CauseHeader] != "x" {
		t.Fatalf("empty fields written: %v", h)
	}
	stripped := deadletter.Strip(p.Headers, "tenant")
	if len(stripped) != 0 {
		t.Fatalf("Strip left %v", stripped)
	}
	if p.Headers["tenant"] != "t1" || p.Headers[driver.CauseHeader] == "" {
		t.Fatalf("Strip changed its argument: %v", p.Headers)
	}
}

func TestRedrivePurge(t *testing.T) {
	ctx := context.Background()
	s := newShelf()
	q := deadletter.New[int](s)
	var seen []string
	if err := q.Scan(ctx, func(p *admin.Parked) error { seen = append(seen, p.Ref); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, []string{"1", "2", "3", "4"}) || len(s.refs()) != 4 {
		t.Fatalf("Scan saw %v and left %v", seen, s.refs())
	}

	var progress []int
	n, err := q.Redrive(ctx, func(p *admin.Parked) bool { return p.ID == "a" || p.ID == "c" }, func(d int) { progress = append(progress, d) })
	if err != nil || n != 2 || !slices.Equal(progress, []int{1, 2}) {
		t.Fatalf("Redrive = %d, %v, progress %v", n, err, progress)
	}
	if !slices.Equal(s.refs(), []string{"2", "4"}) {
		t.Fatalf("left parked %v, want 2 and 4", s.refs())
	}
	for _, p := range s.published {
		if _, ok := p.Headers[driver.CauseHeader]; ok || p.Headers["tenant"] != "t1" {
			t.Fatalf("republished headers %v: bookkeeping kept or own header lost", p.Headers)
		}
	}

	s.failPub = "2"
	n, err = q.Redrive(ctx, nil, nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), `"b" (ref 2) to orders`) {
		t.Fatalf("failed publish: %d, %v", n, err)
	}
	s.failPub, s.failRemove = "", "2"
	n, err = q.Redrive(ctx, nil, nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "but removing it from orders.dlq failed") {
		t.Fatalf("failed removal: %d, %v", n, err)
	}
	s.failRemove = ""

	s.parked[3].Destination = ""
	n, err = q.Redrive(ctx, func(p *admin.Parked) bool { return p.ID == "" }, nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "(no id) (ref 4) in orders.dlq has no idemq-destination") {
		t.Fatalf("no destination: %d, %v", n, err)
	}

	n, err = q.Purge(ctx, func(p *admin.Parked) bool { return p.ID == "" })
	if n != 1 || err != nil || !slices.Equal(s.refs(), []string{"2"}) {
		t.Fatalf("Purge = %d, %v, left %v", n, err, s.refs())
	}
	if q.Name() != "orders.dlq" || q.Close() != nil || !s.closed {
		t.Fatal("Name or Close not the store's")
	}
}

func TestCauseIsOneLine(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "no cause given"},
		{errors.New(""), "no cause given"},
		{errors.New("bad\r\namount\nfield\rx"), "bad amount field x"},
	} {
		if got := deadletter.Cause(c.err); got != c.want {
			t.Errorf("Cause(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestRefsNameCopiesByContent(t *testing.T) {
	first, again := deadletter.Refs{}, deadletter.Refs{}
	a := first.Of("id-1", "body")
	if len(a) != 16 || strings.Contains(a, "~") {
		t.Fatalf("Ref %q, want 16 hex digits", a)
	}
	if b := again.Of("id-1", "body"); b != a {
		t.Errorf("the same copy in another call: %q, want %q", b, a)
	}
	if b := first.Of("id-1", "body"); b != a+"~2" {
		t.Errorf("an identical copy in the same call: %q, want %q~2", b, a)
	}
	if b := first.Of("id-1", "bod", "y"); b == a || strings.HasPrefix(b, a) {
		t.Errorf("other fields with the same bytes got %q, like %q", b, a)
	}
	if x, y := first.Of("ab", "c"), first.Of("a", "bc"); x == y {
		t.Errorf("fields moved across a joint collide: %q", x)
	}
}

// batchShelf is a shelf as a BatchStore: it hands out copies two at a
// time and records the batches it removes.
type batchShelf struct {
	*shelf
	removed [][]int
}

func (s *batchShelf) EachBatch(ctx context.Context, fn func(refs []int, ps []*admin.Parked) error) error {
	var refs []int
	var ps []*admin.Parked
	err := s.Each(ctx, func(ref int, p *admin.Parked) error {
		if refs, ps = append(refs, ref), append(ps, p); len(refs) < 2 {
			return nil
		}
		err := fn(refs, ps)
		refs, ps = nil, nil
		return err
	})
	if err == nil && len(refs) > 0 {
		err = fn(refs, ps)
	}
	return err
}

func (s *batchShelf) RemoveBatch(ctx context.Context, refs []int) []error {
	s.removed = append(s.removed, slices.Clone(refs))
	errs := make([]error, len(refs))
	for i, ref := range refs {
		errs[i] = s.Remove(ctx, ref)
	}
	return errs
}

// TestBatches: Purge and Redrive remove each batch's chosen copies in one
// RemoveBatch call.
func TestBatches(t *testing.T) {
	ctx := context.Background()
	s := &batchShelf{shelf: newShelf()}
	s.failRemove = "3"
	n, err := deadletter.NewBatched[int](s).Purge(ctx, func(p *admin.Parked) bool { return p.Ref != "2" })
	if n != 2 || err == nil || !strings.Contains(err.Error(), `purging dead letter "c" (ref 3) from orders.dlq: gone away`) {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	// The chosen copies of each batch in one call; the error in the
	// second batch stops the walk after that batch.
	if !slices.EqualFunc(s.removed, [][]int{{0}, {2, 3}}, slices.Equal) || !slices.Equal(s.refs(), []string{"2", "3"}) {
		t.Fatalf("removed %v, left %v", s.removed, s.refs())
	}
	s.failRemove, s.removed = "", nil
	if n, err = deadletter.NewBatched[int](s).Purge(ctx, nil); n != 2 || err != nil || !slices.EqualFunc(s.removed, [][]int{{1, 2}}, slices.Equal) || len(s.refs()) != 0 {
		t.Fatalf("Purge = %d, %v; removed %v, left %v", n, err, s.removed, s.refs())
	}
	s.shelf, s.removed = newShelf(), nil
	var progress []int
	n, err = deadletter.NewBatched[int](s).Redrive(ctx, func(p *admin.Parked) bool { return p.Ref != "1" }, func(d int) { progress = append(progress, d) })
	if n != 3 || err != nil || !slices.EqualFunc(s.removed, [][]int{{1}, {2, 3}}, slices.Equal) || !slices.Equal(progress, []int{1, 2, 3}) || len(s.published) != 3 {
		t.Fatalf("Redrive = %d, %v; removed %v, progress %v, published %d", n, err, s.removed, progress, len(s.published))
	}
	// A failed publish stops the call, but what its batch published before
	// is removed.
	s.shelf, s.removed = newShelf(), nil
	s.failPub = "2"
	n, err = deadletter.NewBatched[int](s).Redrive(ctx, nil, nil)
	if n != 1 || err == nil || !strings.Contains(err.Error(), `redriving dead letter "b" (ref 2)`) || !slices.EqualFunc(s.removed, [][]int{{0}}, slices.Equal) {
		t.Fatalf("Redrive = %d, %v; removed %v", n, err, s.removed)
	}
}
