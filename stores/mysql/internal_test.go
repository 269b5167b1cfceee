package mysql

import "testing"

func TestSupportsReturning(t *testing.T) {
	for version, want := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.5.0-MariaDB":             true,
		"11.4.2-MariaDB":             true,
		"10.4.32-MariaDB":            false,
		"8.0.36":                     false,
		"8.4.0-0ubuntu":              false,
		"garbage":                    false,
	} {
		if got := supportsReturning(version); got != want {
			t.Errorf("supportsReturning(%q) = %v, want %v", version, got, want)
		}
	}
}
