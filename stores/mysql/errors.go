package mysql

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"

	"github.com/idemq/idemq/stores/internal/sqlstore"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// Server error numbers IsTransient treats as worth a retry.
const (
	errServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	errTooManyConns     = 1040 // ER_CON_COUNT_ERROR
	errLockWaitTimeout  = 1205 // ER_LOCK_WAIT_TIMEOUT
	errDeadlock         = 1213 // ER_LOCK_DEADLOCK
	errQueryInterrupted = 1317 // ER_QUERY_INTERRUPTED
	errConnKilled       = 1927 // ER_CONNECTION_KILLED (MariaDB)
	errGoneAway         = 2006 // CR_SERVER_GONE_ERROR
	errLost             = 2013 // CR_SERVER_LOST
	errOptionPrevents   = 1290 // ER_OPTION_PREVENTS_STATEMENT: transient for --read-only only
	errReadOnlyMode     = 1836 // ER_READ_ONLY_MODE
	errUnknownCom       = 1047 // ER_UNKNOWN_COM_ERROR: transient as Galera's "WSREP has not yet prepared node" only
)

// errDupEntry is ER_DUP_ENTRY: an INSERT ran into an existing key.
const errDupEntry = 1062

// Server error numbers of a lease table that is not there, or not the
// user's to use.
const (
	errNoSuchTable       = 1146 // ER_NO_SUCH_TABLE
	errTableAccessDenied = 1142 // ER_TABLEACCESS_DENIED_ERROR
)

// serverErrors sorts go-sql-driver's errors for the engine.
var serverErrors = sqlstore.Errors{
	Code: func(err error) (int, string, bool) {
		var me *mysqldrv.MySQLError
		if !errors.As(err, &me) {
			return 0, "", false
		}
		return int(me.Number), me.Message, true
	},
	Duplicate: errDupEntry,
	Retry: func(code int, msg string) bool {
		switch code {
		case errDeadlock, errLockWaitTimeout, errConnKilled, errQueryInterrupted,
			errServerShutdown, errGoneAway, errLost, errTooManyConns, errReadOnlyMode:
			return true
		case errUnknownCom:
			// A Galera node outside the primary component, until it
			// rejoins one.
			return strings.Contains(msg, "WSREP")
		case errOptionPrevents:
			// Other options (secure_file_priv, …) refuse a statement
			// for good.
			return strings.Contains(msg, "read-only") || strings.Contains(msg, "read_only")
		}
		return false
	},
	// A deadlock rolls the whole transaction back; on Galera it is also
	// how a certification conflict with another node's commit surfaces.
	Conflict: func(code int, _ string) bool { return code == errDeadlock },
	NoTable:  func(code int, _ string) bool { return code == errNoSuchTable || code == errTableAccessDenied },
	Lost:     func(err error) bool { return connGone(err) || sqlstore.ConnLost(err) },
	Gone:     connGone,
}

// IsTransient reports whether err is worth retrying with a new
// transaction: a deadlock (1213), a lock wait timeout (1205), a killed or
// interrupted connection or query (1927, 1317), a server shutting down or
// gone (1053, 2006, 2013), too many connections (1040), a write refused by
// a read-only server (1290 naming the read-only option, 1836: a replica,
// or a primary demoted in a failover), a Galera node outside the primary
// component (1047, WSREP not ready), or a connection lost on the client
// side (invalid connection, bad connection, EOF, network error, deadline).
// Other server errors, including a duplicate key (1062) in a business
// effect, are not transient.
func IsTransient(err error) bool { return serverErrors.Transient(err) }

// connGone reports the errors of a connection that is gone, whose
// transaction the server has rolled back.
func connGone(err error) bool {
	return errors.Is(err, mysqldrv.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone)
}
