// Package sqlident checks the table names that idemq's stores, outboxes
// and effects tables splice into SQL text. Names are never quoted there, so
// this check is what stands between a configuration value and SQL
// injection: only ASCII letters, digits and underscores pass.
package sqlident

import (
	"errors"
	"fmt"
)

// MaxLength is the longest name Check accepts by default: the Postgres
// limit, kept the same everywhere so that a name is portable.
const MaxLength = 63

// Check reports whether name can be spliced into SQL as a table name:
// ASCII letters, digits and underscores, not starting with a digit, 1 to
// MaxLength characters. Its errors quote at most the one offending
// character, never the name, which a misplaced value could fill with a
// password.
func Check(name string) error { return CheckMax(name, MaxLength) }

// CheckMax is Check with another length limit, for a table whose name
// other names are derived from (a suffix must still fit the database's
// limit).
func CheckMax(name string, maxLen int) error {
	if name == "" {
		return errors.New("empty table name")
	}
	if len(name) > maxLen {
		return fmt.Errorf("table name is %d characters long, at most %d allowed", len(name), maxLen)
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		switch {
		case ch == '_', ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z':
		case ch >= '0' && ch <= '9':
			if i == 0 {
				return errors.New("table name starts with a digit")
			}
		default:
			return fmt.Errorf("table name holds %q: only letters, digits and underscores are allowed", ch)
		}
	}
	return nil
}
