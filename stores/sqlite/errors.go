package sqlite

import (
	"context"
	"errors"
	"strings"

	"github.com/idemq/idemq/stores/internal/sqlstore"
	msqlite "modernc.org/sqlite"
)

// SQLite primary result codes IsTransient treats as worth a retry.
const (
	codeBusy   = 5 // SQLITE_BUSY: another connection held the write lock past busy_timeout
	codeLocked = 6 // SQLITE_LOCKED: a conflict inside one connection's shared cache
)

// IsTransient reports whether err is worth retrying with a new
// transaction: SQLITE_BUSY (the write lock stayed taken longer than
// busy_timeout) or SQLITE_LOCKED, in any extended form, or a context
// deadline. Other errors are not transient.
func IsTransient(err error) bool { return engineErrors.Transient(err) }

// engineErrors sorts modernc.org/sqlite's errors for the engine. A lease
// table that is not there (Migrate has not run since leases came) has no
// code of its own, only SQLITE_ERROR and the message.
var engineErrors = sqlstore.Errors{
	Code: func(err error) (int, string, bool) {
		var se *msqlite.Error
		if !errors.As(err, &se) {
			return 0, "", false
		}
		return se.Code() & 0xff, se.Error(), true
	},
	Retry:   func(code int, _ string) bool { return code == codeBusy || code == codeLocked },
	NoTable: func(_ int, msg string) bool { return strings.Contains(msg, "no such table") },
	Lost:    func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
}
