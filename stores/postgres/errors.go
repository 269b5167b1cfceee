package postgres

import (
	"errors"
	"github.com/idemq/idemq/core/driver"
	"strings"

	"github.com/idemq/idemq/stores/internal/sqlstore"
	"github.com/jackc/pgx/v5/pgconn"
)

// readOnlyTransaction is the SQLSTATE of a write refused by a server that
// takes none: a hot standby, or a primary demoted in a failover.
const readOnlyTransaction = "25006"

// IsTransient reports whether err is worth retrying with a new
// transaction: a serialization failure (40001), a deadlock (40P01), a lock
// or statement timeout (55P03, 57014 when caused by a deadline), an
// administrator or crash shutdown (57P01, 57P02, 57P03), a connection
// exception (class 08), too many connections (53300), a write refused by a
// read-only server (25006: a standby, or a primary demoted in a failover;
// Claim then drops the connection so that the retry gets a new one), no
// server taking writes among the hosts of a multi-host URL with
// target_session_attrs=read-write (a failover under way), or a connection
// lost on the client side (closed, refused, reset, EOF, network error,
// timeout). Other server errors (syntax, missing table, constraint
// violations of the business effect) are not transient. A unique violation
// never reaches the caller from Claim: taken ids are a ClaimDuplicate
// result.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300", readOnlyTransaction:
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var connectErr *pgconn.ConnectError
	return errors.Is(err, pgconn.ErrConnClosed) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.As(err, &connectErr) || sqlstore.ConnLost(err)
}

var _ driver.Conflicter = (*Store)(nil)

// Conflict implements driver.Conflicter: a serialization failure
// (40001) or a deadlock (40P01) rolled the transaction back.
func (s *Store) Conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// noLeases reports an error that says the lease table is not there
// (42P01: Migrate has not run since leases came) or not the role's to use
// (42501: granted only the dedup table). Prune, Lookup and Forget then
// pass the leases by, so a store that never leases keeps working.
func noLeases(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42501")
}
