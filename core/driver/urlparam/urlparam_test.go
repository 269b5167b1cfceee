package urlparam

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

func table() Table[string] {
	return Table[string]{Scheme: "x", Params: map[string]Param[string]{
		"group":     Text("WithGroup", func(v string) string { return "group=" + v }),
		"ack_wait":  Duration("WithAckWait", func(d time.Duration) string { return "ack_wait=" + d.String() }),
		"declare":   Bool("WithDeclare", func(b bool) string { return map[bool]string{true: "declare", false: "nodeclare"}[b] }),
		"window":    Int("WithWindow", func(n int) string { return "window" }),
		"mode":      Choice("WithMode", map[string]string{"send": "send", "redrive": "redrive"}),
		"id_header": NonEmpty("WithIDHeader", func(v string) string { return "id_header=" + v }),
	}}
}

func TestReadInNameOrderAndRefuseUnknown(t *testing.T) {
	q, _ := url.ParseQuery("group=g&ack_wait=2s&declare=false")
	opts, err := table().Read(q)
	if err != nil || strings.Join(opts, " ") != "ack_wait=2s nodeclare group=g" {
		t.Fatalf("Read = %q, %v", opts, err)
	}
	for raw, want := range map[string]string{
		"ack_wiat=1s":  `x URL: unknown parameter "ack_wiat" (did you mean ack_wait?); known: ack_wait, declare, group, id_header, mode, window`,
		"zzzzzz=1":     `x URL: unknown parameter "zzzzzz"; known:`,
		"ack_wait=s3c": "x URL parameter ack_wait: not a duration like 30s or 168h",
		"declare=s3c":  "x URL parameter declare: not a boolean",
		"window=s3c":   "x URL parameter window: not a number",
		"mode=s3c":     "x URL parameter mode: not redrive or send",
		"id_header=":   "x URL parameter id_header: empty",
	} {
		q, _ := url.ParseQuery(raw)
		_, err := table().Read(q)
		if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "s3c") {
			t.Errorf("%s: %v, want %q and no value", raw, err, want)
		}
	}
}

func TestTakeLeavesTheRest(t *testing.T) {
	q, _ := url.ParseQuery("group=g&sslmode=disable")
	opts, err := table().Take(q)
	if err != nil || len(opts) != 1 || len(q) != 1 || q.Get("sslmode") != "disable" {
		t.Fatalf("Take = %q, %v; left %v", opts, err, q)
	}
}

func TestSplitLeavesTheClientsParameters(t *testing.T) {
	q := url.Values{"group": {"g"}, "heartbeat": {"5", "6"}, "sslmode": {"require"}}
	opts, err := table().Split(q, "heartbeat", "sslmode")
	if err != nil || len(opts) != 1 || opts[0] != "group=g" {
		t.Fatalf("Split = %q, %v", opts, err)
	}
	if q.Encode() != "heartbeat=5&heartbeat=6&sslmode=require" {
		t.Errorf("left %q, want the client's parameters, repeats and all", q.Encode())
	}
	for raw, want := range map[string]string{
		"group=a&group=b":   "x URL parameter group: given 2 times",
		"grup=a":            `unknown parameter "grup" (did you mean group?)`,
		"window=x":          "x URL parameter window: not a number",
		"group=a&p%40ss=1":  "(a name of 4 bytes, not shown)",
		"heartbeat=1&mod=x": "known: ack_wait, declare, group, heartbeat, id_header, mode, window",
	} {
		q, _ := url.ParseQuery(raw)
		if _, err := table().Split(q, "heartbeat"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Split(%s) = %v, want an error with %q", raw, err, want)
		}
	}
}

func TestExplainNamesTheParameter(t *testing.T) {
	base := &OptionError{Pkg: "x", Option: "WithAckWait", Err: errors.New("1ms is under 10ms")}
	err := table().Explain(base)
	if err.Error() != "x URL parameter ack_wait: 1ms is under 10ms" || !errors.Is(err, base) {
		t.Errorf("Explain = %v", err)
	}
	longer := &OptionError{Pkg: "x", Option: "WithAckWaitMax", Err: errors.New("1ms is under 10ms")}
	if table().Explain(longer) != error(longer) {
		t.Errorf("Explain took WithAckWaitMax for WithAckWait: %v", table().Explain(longer))
	}
	other := errors.New("x: dial tcp: refused")
	if table().Explain(other) != other {
		t.Error("Explain changed an error naming no option")
	}
}

func TestNearest(t *testing.T) {
	known := []string{"retention", "table", "migrate", "isolation"}
	for name, want := range map[string]string{"retension": "retention", "isolaton": "isolation", "tabel": "table", "RETENTION": "retention", "zzz": ""} {
		if got := Nearest(name, known); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", name, got, want)
		}
	}
}
