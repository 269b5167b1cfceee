package logging_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/logging"
)

func TestOneLinePerDecisionAtItsLevel(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mw, err := logging.New(logger)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		out   core.Outcome
		level string
	}{
		{core.Outcome{Decision: core.Processed}, "DEBUG"},
		{core.Outcome{Decision: core.Duplicate}, "INFO"},
		{core.Outcome{Decision: core.Retry, Err: errors.New("db busy"), Delay: time.Second}, "WARN"},
		{core.Outcome{Decision: core.DeadLetter, Err: errors.New("card closed")}, "ERROR"},
	}
	for _, tc := range cases {
		buf.Reset()
		m := &core.Message{ID: "pay-1", Body: []byte("secret card number"), Source: "payments", Attempt: 2}
		mw.EndDecision(mw.StartDecision(context.Background(), m), m, tc.out)
		line := buf.String()
		if strings.Count(line, "\n") != 1 {
			t.Fatalf("%v: %d lines", tc.out.Decision, strings.Count(line, "\n"))
		}
		for _, want := range []string{`"level":"` + tc.level + `"`, `"id":"pay-1"`, `"decision":"` + tc.out.Decision.String() + `"`, `"attempt":2`} {
			if !strings.Contains(line, want) {
				t.Errorf("%v: line lacks %s: %s", tc.out.Decision, want, line)
			}
		}
		if tc.out.Err != nil && !strings.Contains(line, tc.out.Err.Error()) {
			t.Errorf("%v: cause missing: %s", tc.out.Decision, line)
		}
		if strings.Contains(line, "secret") {
			t.Errorf("body logged without WithBody: %s", line)
		}
	}
}

func TestBodyOnlyWhenAskedAndLevelsConfigurable(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	mw, err := logging.New(logger, logging.WithBody(6), logging.WithLevel(core.Duplicate, slog.LevelDebug))
	if err != nil {
		t.Fatal(err)
	}
	m := &core.Message{ID: "x", Body: []byte("abcdefghij")}
	mw.EndDecision(mw.StartDecision(context.Background(), m), m, core.Outcome{Decision: core.Duplicate})
	if buf.Len() != 0 {
		t.Errorf("duplicate logged at debug under an info logger: %s", buf.String())
	}
	mw.EndDecision(mw.StartDecision(context.Background(), m), m, core.Outcome{Decision: core.DeadLetter, Err: errors.New("bad")})
	if !strings.Contains(buf.String(), "body=abcdef…") {
		t.Errorf("body not clipped to 6 bytes: %s", buf.String())
	}
}

func TestBadOptionsAreNamed(t *testing.T) {
	for name, o := range map[string]logging.Option{
		"WithBody":  logging.WithBody(-1),
		"WithLevel": logging.WithLevel(core.Decision(99), slog.LevelInfo),
	} {
		if _, err := logging.New(nil, o); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v does not name it", name, err)
		}
	}
}
