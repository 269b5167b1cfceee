package driver

import "context"

// SQLDialect names the SQL a store's database speaks.
type SQLDialect string

// The dialects of the SQL stores.
const (
	// DialectPostgres is PostgreSQL's: placeholders $1, $2, …
	DialectPostgres SQLDialect = "postgres"
	// DialectMySQL is MySQL's and MariaDB's: placeholders ?.
	DialectMySQL SQLDialect = "mysql"
	// DialectSQLite is SQLite's: placeholders ?.
	DialectSQLite SQLDialect = "sqlite"
)

// SQLStore is implemented by stores on a SQL database, so that a package
// keeping a table of its own beside the store's (the stored responses of
// package idempotency) reaches it through the store, whatever client
// library and database/sql driver, wrapped or not, the store runs on.
// Statements use the dialect's placeholders. The store's transactions
// implement SQLTxn.
type SQLStore interface {
	// SQLDialect names the SQL the database speaks.
	SQLDialect() SQLDialect
	// ExecSQL runs a statement outside any transaction and returns how
	// many rows it affected.
	ExecSQL(ctx context.Context, query string, args ...any) (int64, error)
	// QueryRowSQL runs a query outside any transaction and scans its
	// first row into dest; found is false when it returns no row.
	QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (found bool, err error)
}

// SQLTxn is implemented by the transactions of SQLStores: statements of
// another package in the transaction that holds the claims.
type SQLTxn interface {
	// ExecSQL runs a statement in the transaction. A store may send it
	// with the COMMIT (FlushCommitter); its error then comes from
	// FlushCommit.
	ExecSQL(ctx context.Context, query string, args ...any) error
	// QueryRowSQL runs a query in the transaction and scans its first row
	// into dest; found is false when it returns no row.
	QueryRowSQL(ctx context.Context, query string, args []any, dest ...any) (found bool, err error)
}
