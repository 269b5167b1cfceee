package signature

import (
	"strconv"
	"testing"
	"time"
)

func TestParseUnix(t *testing.T) {
	for raw, ok := range map[string]bool{
		"0": true, "1614265330": true, "999999999999999999": true,
		"": false, "00": false, "01614265330": false, "-1": false, "+1": false, " 1": false, "1 ": false,
		"1.5": false, "1e9": false, "0x10": false, "1_000": false, "9999999999999999999": false, "١٢٣": false,
	} {
		ts, err := parseUnix(raw)
		if (err == nil) != ok {
			t.Errorf("parseUnix(%q) = %v, %v; want ok %v", raw, ts, err, ok)
		}
	}
}

// FuzzUnixTimestamp checks the parser of webhook-timestamp and Stripe's t=:
// it never panics, and what it accepts is the canonical decimal form of
// the time it returns, so the string signed and the time checked agree.
func FuzzUnixTimestamp(f *testing.F) {
	for _, s := range []string{"0", "1614265330", "01614265330", "-1", "+1", "", "1.5", "999999999999999999", "9223372036854775807", "9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		ts, err := parseUnix(raw)
		if err != nil {
			return
		}
		if got := strconv.FormatInt(ts.Unix(), 10); got != raw {
			t.Fatalf("parseUnix(%q) = %s, not canonical", raw, got)
		}
		_ = checkTolerance(ts, time.Unix(1614265330, 0), time.Minute)
	})
}
