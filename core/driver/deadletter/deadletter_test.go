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
