package sqlstore

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver/urlparam"
)

type testConfig struct {
	Config
	extra int
}

type testOption func(*testConfig) error

func TestBuild(t *testing.T) {
	c, err := Build(testConfig{Config: NewConfig("st"), extra: 1}, []testOption{
		nil,
		func(c *testConfig) error { return c.SetTable("claims") },
		func(c *testConfig) error { return c.SetRetention(time.Hour) },
		func(c *testConfig) error { return c.SetMigrate(false) },
	})
	if err != nil || c.Table != "claims" || c.Retention != time.Hour || !c.NoMigrate || c.extra != 1 || c.Now == nil {
		t.Fatalf("Build = %+v, %v", c, err)
	}
	_, err = Build(testConfig{Config: NewConfig("st")}, []testOption{
		func(c *testConfig) error { return c.SetTable("a-b") },
		func(c *testConfig) error { return c.SetRetention(0) },
		func(c *testConfig) error { return c.SetClock(nil) },
	})
	for _, want := range []string{"st: WithTable: table name holds '-'", "st: WithRetention: must be positive, got 0s", "st: WithClock: nil clock"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Build error %v lacks %q", err, want)
		}
	}
}

func TestURLParamsSplit(t *testing.T) {
	p := URLParams[string]{
		Table: urlparam.Table[string]{Scheme: "st", Params: map[string]urlparam.Param[string]{
			"table":     urlparam.Text("WithTable", func(v string) string { return "table=" + v }),
			"retention": urlparam.Duration("WithRetention", func(d time.Duration) string { return "retention=" + d.String() }),
			"migrate":   urlparam.Bool("WithMigrate", func(b bool) string { return "migrate=" + map[bool]string{true: "y", false: "n"}[b] }),
			"level":     urlparam.Choice("WithLevel", map[string]string{"low": "level=low", "high": "level=high"}),
		}},
		Driver:    []string{"sslmode"},
		Prefix:    "drv.",
		PrefixFor: "a server parameter",
	}
	u, _ := url.Parse("st://u:pw@h/db?table=t&table=u&retention=2h&migrate=false&level=high&sslmode=disable&drv.timezone=UTC")
	rest, opts, err := p.Split(u)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(opts, " "); got != "level=high migrate=n retention=2h0m0s table=t" {
		t.Errorf("options %q", got)
	}
	if rest != "st://u:pw@h/db?sslmode=disable&timezone=UTC" {
		t.Errorf("the driver gets %q, want sslmode and the unprefixed timezone only", rest)
	}
	for raw, want := range map[string]string{
		"retention=s3cret": "st URL parameter retention: not a duration",
		"migrate=s3cret":   "st URL parameter migrate: not a boolean",
		"level=s3cret":     "st URL parameter level: not high or low",
		"retension=24h":    `st URL: unknown parameter "retension" (did you mean retention?)`,
		"isolaton=x":       "a server parameter goes as drv.NAME=value",
	} {
		u, _ := url.Parse("st://h/db?" + raw)
		if _, _, err := p.Split(u); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want %q without the value", raw, err, want)
		}
	}
}
