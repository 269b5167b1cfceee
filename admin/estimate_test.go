package admin

import "testing"

// The bounded count's SQL, its cap, and how the figures read.
func TestEstimateHelpers(t *testing.T) {
	if got, want := BoundedCountSQL("t", 10), "SELECT COUNT(*) FROM (SELECT 1 FROM t LIMIT 11) AS bounded"; got != want {
		t.Errorf("BoundedCountSQL = %q, want %q", got, want)
	}
	for _, c := range []struct {
		n         int64
		rows      int64
		atLeast   bool
		rowsText  string
		statistic bool
	}{
		{0, 0, false, "0", false},
		{10, 10, false, "10", false},
		{11, 10, true, "10+", false},
		{1234, 1234, false, "about 1234", true},
	} {
		var e TableEstimate
		if c.statistic {
			e.Rows = c.n
		} else {
			CappedCount(&e, c.n, 10)
		}
		if e.Rows != c.rows || e.AtLeast != c.atLeast || e.Counted == c.statistic || e.RowsText() != c.rowsText {
			t.Errorf("n=%d: %+v (%q), want rows %d, at least %v, %q", c.n, e, e.RowsText(), c.rows, c.atLeast, c.rowsText)
		}
	}
	for n, want := range map[int]string{0: "counted up to 0", 999: "counted up to 999", 10000: "counted up to 10,000", 1234567: "counted up to 1,234,567"} {
		if got := CountedUpTo(n); got != want {
			t.Errorf("CountedUpTo(%d) = %q, want %q", n, got, want)
		}
	}
	if got := thousands(-1234); got != "-1,234" {
		t.Errorf("thousands(-1234) = %q", got)
	}
}
