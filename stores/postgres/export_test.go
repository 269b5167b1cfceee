package postgres

import "fmt"

// ClaimsPerMinuteSQL is the query of ClaimsPerMinute on table, for the
// tests to EXPLAIN.
func ClaimsPerMinuteSQL(table string) string { return fmt.Sprintf(claimsPerMinuteSQL, table) }
