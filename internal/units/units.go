// Package units renders sizes, ages and counts as operators read them, the same in
// the idemq command and in the console.
package units

import (
	"fmt"
	"time"
)

// Age renders how long ago something happened the way operators compare it
// with a retention: seconds under a minute, minutes under two days, days
// after.
func Age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%.1fd", d.Hours()/24)
}

// Bytes renders n bytes in binary units: 512 B, 1.5 KiB, 3.2 GiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Count renders n with commas between groups of three digits: 10,000.
func Count(n int64) string {
	if n < 0 {
		return "-" + Count(-n)
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
