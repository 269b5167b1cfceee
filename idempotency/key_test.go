package idempotency

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`"abc"`, "abc"},
		{` "8e03978e-40d5-43e8-bc93-6894a57f9324"	`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`"a \"quoted\" \\ key, with; commas"`, `a "quoted" \ key, with; commas`},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`YWJj+/Zg==`, "YWJj+/Zg=="},
		{`urn:order:42`, "urn:order:42"},
		{`"` + strings.Repeat("k", MaxKeyLength) + `"`, strings.Repeat("k", MaxKeyLength)},
	} {
		got, err := parseKey(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseKey(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{``, `  `, `""`, `"abc`, `"abc";p=1`, `"a"b"`, `"a\b"`, `"a\`, "\"tab\there\"", `"é"`,
		`a b`, `a,b`, `"abc`, `a"b`, `a;p`, strings.Repeat("k", MaxKeyLength+1)} {
		if got, err := parseKey(in); !errors.Is(err, errKey) {
			t.Errorf("parseKey(%q) = %q, %v; want a malformed-key error", in, got, err)
		}
	}
}

// The parser never panics, refuses with errKey only, and gives back a
// non-empty key of printable ASCII within MaxKeyLength that, quoted again
// as an sf-string, parses to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `""`, `"\\"`, ` "x" `, `"x";y`, "\"\x7f\"", `a/b=`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := parseKey(in)
		if err != nil {
			if !errors.Is(err, errKey) || k != "" {
				t.Fatalf("parseKey(%q) = %q, %v", in, k, err)
			}
			return
		}
		if k == "" || len(k) > MaxKeyLength {
			t.Fatalf("parseKey(%q) = %q", in, k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("parseKey(%q) = %q: byte %d not printable", in, k, i)
			}
		}
		if again, err := parseKey(strconv.Quote(k)); err != nil || again != k {
			t.Fatalf("%q quoted parses to %q, %v", k, again, err)
		}
	})
}
