package units

import (
	"testing"
	"time"
)

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:             "0s",
		1500 * time.Millisecond:  "2s",
		90 * time.Second:         "2m0s",
		47 * time.Hour:           "47h0m0s",
		72 * time.Hour:           "3.0d",
		36*time.Hour + time.Hour: "37h0m0s",
	} {
		if got := Age(d); got != want {
			t.Errorf("Age(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := Count(n); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}
