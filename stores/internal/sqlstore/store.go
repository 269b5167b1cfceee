package sqlstore

import (
	"io"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
)

// Store is what every SQL dedup store implements, the optional interfaces
// core looks for included. Each store asserts it at compile time, so none
// drifts from the others.
type Store[Tx any] interface {
	driver.Store[Tx]
	admin.Pruner
	driver.Retentioner
	admin.Migrator
	admin.Inspector
	admin.Estimator
	admin.MinuteCounter
	driver.Pinger
	admin.Lookuper
	admin.Forgetter
	driver.Leaser
	driver.SQLStore
	driver.Conflicter
	io.Closer
}

// Txn is what every SQL store's transaction implements: claims,
// savepoints and fencing of leases.
type Txn[Tx any] interface {
	driver.Txn[Tx]
	driver.Savepointer
	driver.Fencer
	driver.SQLTxn
}
