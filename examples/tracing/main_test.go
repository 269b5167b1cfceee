package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestPrintsASpanPerDecision(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if n := strings.Count(s, `"Name": "process orders"`); n != 3 {
		t.Errorf("%d process spans, want 3", n)
	}
	for _, want := range []string{`"processed"`, `"duplicate"`, `"dead_letter"`, `"send orders"`, `"idemq claim"`, `"Links": [`} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %s", want)
		}
	}
}
