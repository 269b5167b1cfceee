package option

import (
	"errors"
	"testing"
	"time"
)

type config struct{ n int }

type opt func(*config) error

func TestApplySetsInOrderSkipsNilAndStopsAtTheFirstError(t *testing.T) {
	var c config
	err := Apply(&c,
		opt(Set("pkg", "WithN", Range(3, 1, 5), func(c *config) { c.n = 3 })),
		nil,
		opt(Set("pkg", "WithN", Range(9, 1, 5), func(c *config) { c.n = 9 })),
		opt(Set("pkg", "WithN", nil, func(c *config) { c.n = 4 })))
	if err == nil || err.Error() != "pkg: option WithN: 9 is outside 1..5" {
		t.Fatalf("err = %v, want the out-of-range option named", err)
	}
	if c.n != 3 {
		t.Fatalf("n = %d: the failing option or a later one was applied", c.n)
	}
}

func TestChecks(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{Range(time.Hour, 0, time.Minute), "1h0m0s is outside 0s..1m0s"},
		{AtLeast(0, 1), "0 must be at least 1"},
		{Positive(-time.Second), "-1s must be positive"},
		{NotNil(false, "logger"), "nil logger"},
		{Refuse(true, "unknown ordering %d", 7), "unknown ordering 7"},
		{NoneNil([]func(){func() {}, nil}, "middleware"), "middleware 1 is nil"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("got %v, want %q", c.err, c.want)
		}
	}
	if Range(3, 1, 5) != nil || AtLeast(1, 1) != nil || Positive(1) != nil || NotNil(true, "x") != nil || Refuse(false, "x") != nil || NoneNil([]func(){func() {}}, "m") != nil {
		t.Error("a value within its bounds was refused")
	}
}

func TestApplyAllJoinsEveryError(t *testing.T) {
	type cfg struct{ n int }
	bad := func(msg string) func(*cfg) error { return func(*cfg) error { return errors.New(msg) } }
	var c cfg
	err := ApplyAll(&c, func(c *cfg) error { c.n = 3; return nil }, nil, bad("first"), bad("second"))
	if c.n != 3 || err == nil || err.Error() != "first\nsecond" {
		t.Fatalf("ApplyAll: n %d, err %v", c.n, err)
	}
	if ApplyAll[cfg, func(*cfg) error](&c) != nil {
		t.Fatal("no options gave an error")
	}
}
