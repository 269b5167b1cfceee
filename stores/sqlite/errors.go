package sqlite

import (
	"context"
	"errors"
	"strings"

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
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case codeBusy, codeLocked:
			return true
		}
		return false
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// noSuchTable reports an error that says the lease table is not there
// (sqlstore.Claims.NoLeases): Migrate has not run since leases came.
// SQLite gives it no code of its own, only SQLITE_ERROR and the message.
func noSuchTable(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && strings.Contains(se.Error(), "no such table")
}
