package sqlstore

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

type testConfig struct {
	Config
	extra int
}

type testOption func(*testConfig)

func TestBuild(t *testing.T) {
	c, err := Build(testConfig{Config: NewConfig("st"), extra: 1}, []testOption{
		nil,
		func(c *testConfig) { c.SetTable("claims") },
		func(c *testConfig) { c.SetRetention(time.Hour) },
		func(c *testConfig) { c.SetMigrate(false) },
	})
	if err != nil || c.Table != "claims" || c.Retention != time.Hour || !c.NoMigrate || c.extra != 1 || c.Now == nil {
		t.Fatalf("Build = %+v, %v", c, err)
	}
	_, err = Build(testConfig{Config: NewConfig("st")}, []testOption{
		func(c *testConfig) { c.SetTable("a-b") },
		func(c *testConfig) { c.SetRetention(0) },
		func(c *testConfig) { c.SetClock(nil) },
	})
	for _, want := range []string{"st: WithTable: table name holds '-'", "st: WithRetention: must be positive, got 0s", "st: WithClock: nil clock"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Build error %v lacks %q", err, want)
		}
	}
}

func TestURLParamsTake(t *testing.T) {
	p := URLParams[string]{
		Store:     "st",
		Strings:   map[string]func(string) string{"table": func(v string) string { return "table=" + v }},
		Durations: map[string]func(time.Duration) string{"retention": func(d time.Duration) string { return "retention=" + d.String() }},
		Bools:     map[string]func(bool) string{"migrate": func(b bool) string { return "migrate=" + map[bool]string{true: "y", false: "n"}[b] }},
		Choices:   map[string]map[string]string{"level": {"low": "level=low", "high": "level=high"}},
	}
	q := url.Values{"table": {"t", "u"}, "retention": {"2h"}, "migrate": {"false"}, "level": {"high"}, "other": {"x"}}
	opts, err := p.Take(q)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(opts, " "); got != "level=high migrate=n retention=2h0m0s table=t" {
		t.Errorf("options %q", got)
	}
	if len(q) != 1 || q.Get("other") != "x" {
		t.Errorf("left %v, want only other", q)
	}
	for raw, want := range map[string]string{
		"retention=s3cret": "st URL parameter retention: not a duration like 168h",
		"migrate=s3cret":   "st URL parameter migrate: not true or false",
		"level=s3cret":     "st URL parameter level: not high or low",
	} {
		q, _ := url.ParseQuery(raw)
		if _, err := p.Take(q); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}
