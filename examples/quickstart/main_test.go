package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

// The quickstart is the project's main job: it must stay correct under its
// own fault injection, at both batch sizes.
func TestQuickstartKeepsEveryInvariant(t *testing.T) {
	s, err := parseFlags([]string{"-n", "1500", "-batch", "1,50", "-crashes", "0.01", "-lose-acks", "0.02", "-visibility", "300ms", "-progress=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ok, err := run(context.Background(), s, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !strings.Contains(out.String(), "OK: every account balance equals the expected one") {
		t.Fatalf("quickstart failed:\n%s", out.String())
	}
	for _, row := range []string{"ids applied twice", "wrong balances", "lost messages", "msgs/s"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("table lacks %q:\n%s", row, out.String())
		}
	}
}

func TestQuickstartFlags(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-batch") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
	for _, bad := range [][]string{{"-batch", "0"}, {"-duplicates", "1.5"}, {"-n", "0"}, {"extra"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
}
