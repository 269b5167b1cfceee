package core

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/core/driver"
)

func TestFingerprintIsShortStableAndTellsBodiesApart(t *testing.T) {
	a, b := Fingerprint([]byte("one")), Fingerprint([]byte("two"))
	if len(a) != 22 || strings.ContainsAny(a, "+/=") {
		t.Errorf("Fingerprint = %q: want 22 characters of unpadded base64url", a)
	}
	if a != Fingerprint([]byte("one")) {
		t.Error("Fingerprint of one body differs between calls")
	}
	if a == b {
		t.Errorf("two bodies, one fingerprint %q", a)
	}
	// The first 128 bits of SHA-256("one").
	if want := "dpLDrTVAu4A8Ags67mbNiA"; a != want {
		t.Errorf("Fingerprint(one) = %q, want %q", a, want)
	}
}

func TestClassifyStored(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	for _, c := range []struct {
		claimed, stored string
		want            driver.ClaimResult
	}{
		{"abc", "abc", driver.ClaimDuplicate},
		{"abc", "abd", driver.ClaimMismatch},
		{"", "abc", driver.ClaimDuplicate},
		{"abc", "", driver.ClaimDuplicate},
		{Fingerprint([]byte("x")), hex64, driver.ClaimDuplicate}, // stored by an earlier fingerprint function
		{strings.Repeat("cd", 32), hex64, driver.ClaimMismatch},
	} {
		if got := driver.ClassifyStored(c.claimed, c.stored); got != c.want {
			t.Errorf("driver.ClassifyStored(%q, %q) = %v, want %v", c.claimed, c.stored, got, c.want)
		}
	}
}
