package sqlstore

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/core/driver"
)

// Returning says what the claims' INSERT gives back.
type Returning int

const (
	// ReturnNone: nothing; a SELECT reads the rows back (MySQL 8).
	ReturnNone Returning = iota
	// ReturnAll: every row of the batch, inserted or found (MariaDB
	// 10.5+, whose no-op update returns the rows it found too), with NULL
	// for a row carrying the claim call's token and the stored
	// fingerprint for any other.
	ReturnAll
	// ReturnInserted: the ids of the rows it inserted (SQLite's DO
	// NOTHING).
	ReturnInserted
)

// Dialect is what a database/sql store's SQL and driver say differently;
// the Engine does the rest the same way for every store.
type Dialect struct {
	// SQL names the dialect to packages that keep tables of their own in
	// the store's database (driver.SQLStore).
	SQL driver.SQLDialect
	// Numbered says the driver takes numbered placeholders (?1 is the
	// consumer, ?2… the ids); otherwise they are plain ?. The lease
	// statements use ?, which every driver takes.
	Numbered bool
	// InsertChunk is the most claims one INSERT holds, ListChunk the most
	// ids one statement lists.
	InsertChunk, ListChunk int
	// Tables returns the DDL of the dedup table t, LeaseTables that of the
	// lease table lt; every statement is idempotent (IF NOT EXISTS).
	Tables, LeaseTables func(t string) []string
	// RunDDL runs Migrate's statements; nil runs them in one transaction.
	RunDDL func(ctx context.Context, db *sql.DB, table string, stmts []string) error
	// Token is the dedup table's column holding a claim call's random
	// token ("claim_token"); "" where there is none.
	Token string
	// OnConflict ends the claims' INSERT so that a taken key leaves its
	// row as it is and raises no error.
	OnConflict string
	// Returning is what the claims' INSERT returns; Mode, when set,
	// decides it instead (from the server's version), at the first Begin
	// it answers without an error.
	Returning Returning
	Mode      func(context.Context) (Returning, error)
	// Lock ends a SELECT that must lock the rows it reads (" FOR UPDATE");
	// "" where every transaction holds the write lock (SQLite).
	Lock string
	// TimeText reads a time expression as timeFormat text; nil where the
	// column holds that text.
	TimeText func(expr string) string
	// DeleteOldest returns the statement that deletes at most limit rows
	// of table whose col is before its first argument, oldest first, and
	// the arguments that follow that one.
	DeleteOldest func(table, col string, limit int) (string, []any)
	// SizeSQL takes the table's name and returns the bytes it takes;
	// with SizeOptional a failing SizeSQL leaves the size unknown (0).
	SizeSQL      string
	SizeOptional bool
	// BeginTx are the options of Begin's transactions; LeaseTx those of
	// the lease methods' own (MySQL: READ COMMITTED, so that each read
	// after a lock sees the latest commit).
	BeginTx, LeaseTx *sql.TxOptions
	// Check checks the consumer and claims of a call op against the
	// columns' limits; nil checks only that consumer is not empty.
	Check func(op, consumer string, claims []driver.Claim) error
	// Errors sorts the driver's errors.
	Errors Errors
}

// Errors sorts a driver's errors into the classes a store acts on.
type Errors struct {
	// Code returns the number and message of the server's (or engine's)
	// error in err's chain.
	Code func(err error) (code int, msg string, ok bool)
	// Duplicate is the number of a duplicate-key error, met by an INSERT
	// of a lease row a concurrent Acquire inserted first; 0 where that
	// cannot happen.
	Duplicate int
	// Retry tells the errors worth a new transaction: deadlock, lock
	// wait timeout, a busy database, a server going away.
	Retry func(code int, msg string) bool
	// Conflict tells the errors of a transaction a concurrent one aborted
	// (a deadlock): see driver.Conflicter.
	Conflict func(code int, msg string) bool
	// NoTable tells an error that says the lease table is not there
	// (Migrate has not run since leases came) or not the user's to use:
	// Prune, Lookup and Forget then pass the leases by, so a store that
	// never leases keeps working.
	NoTable func(code int, msg string) bool
	// Lost reports a client-side error (one without a number) worth a new
	// transaction: a connection lost.
	Lost func(error) bool
	// Gone reports a rollback error that means the connection is gone, so
	// the server has rolled the transaction back already; nil when the
	// driver has none.
	Gone func(error) bool
}

// Transient is a store's IsTransient: a server error Retry tells, or a
// client-side one Lost reports.
func (e *Errors) Transient(err error) bool {
	if err == nil {
		return false
	}
	if code, msg, ok := e.Code(err); ok {
		return e.Retry(code, msg)
	}
	return e.Lost != nil && e.Lost(err)
}

// is reports whether err is a server error that class tells.
func (e *Errors) is(err error, class func(int, string) bool) bool {
	if err == nil || class == nil {
		return false
	}
	code, msg, ok := e.Code(err)
	return ok && class(code, msg)
}

// duplicate reports a duplicate-key error.
func (e *Errors) duplicate(err error) bool {
	return e.Duplicate != 0 && e.is(err, func(code int, _ string) bool { return code == e.Duplicate })
}
