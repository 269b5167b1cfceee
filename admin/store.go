package admin

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/registry"
)

// Store is a dedup store opened for operations, whatever the transaction
// type its handlers take. Each operation needs the store to implement the
// interface of the same name (Migrator, Pruner, Inspector, Estimator,
// Lookuper, Forgetter); one it does not implement fails with an error wrapping
// errors.ErrUnsupported. The SQL stores implement all of them.
type Store struct {
	url   string
	store closer
}

// closer is what every store has whatever its transaction type.
type closer interface {
	Close() error
	As(target any) bool
}

// OpenStore opens the store registered for rawURL's scheme (postgres://,
// mysql://, sqlite://, …) with driver.RegisterStore. Errors never contain
// credentials.
func OpenStore(ctx context.Context, rawURL string) (*Store, error) {
	s, u, err := registry.Open(registry.Stores, rawURL, "store", func(o any, u *url.URL) (any, error) {
		return o.(driver.StoreOpener)(ctx, u)
	})
	if err != nil {
		return nil, err
	}
	c, ok := s.(closer)
	if !ok {
		return nil, fmt.Errorf("idemq: store %s:// opened a %T, which has no Close and As methods", u.Scheme, s)
	}
	return &Store{url: rawURL, store: c}, nil
}

// Close releases the store's connections.
func (s *Store) Close() error { return s.store.Close() }

// As hands out what lies beneath the store, as driver.Store's As does: its
// pool (**pgxpool.Pool, **sql.DB), or the store itself for a pointer to its
// type or to an interface it implements.
func (s *Store) As(target any) bool { return s.store.As(target) }

// Table returns the dedup table's name, or "(dedup table)" when the store
// does not tell it.
func (s *Store) Table() string {
	if t, ok := s.store.(interface{ Table() string }); ok {
		return t.Table()
	}
	return "(dedup table)"
}

// unsupported is the error of an operation the store does not implement.
func (s *Store) unsupported(what string) error {
	return fmt.Errorf("idemq: the store at %s cannot %s: %w", redact.URL(s.url), what, errors.ErrUnsupported)
}

// hide returns err without rawURL's secrets: a driver's error may quote
// its URL.
func (s *Store) hide(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(redact.Error(err, s.url))
}

// use runs op on the store as C, the interface an operation needs; a
// store that does not implement it fails with the error of unsupported
// (what it cannot do), and op's error comes back hidden.
func use[C, R any](s *Store, what string, op func(C) (R, error)) (R, error) {
	c, ok := s.store.(C)
	if !ok {
		var none R
		return none, s.unsupported(what)
	}
	r, err := op(c)
	return r, s.hide(err)
}

// Migrate creates the store's tables if they do not exist (Migrator).
func (s *Store) Migrate(ctx context.Context) error {
	m, ok := s.store.(Migrator)
	if !ok {
		return s.unsupported("migrate itself")
	}
	return s.hide(m.Migrate(ctx))
}

// Prune deletes the claims recorded before before, batch by batch as o
// says (Pruner, see the function Prune), and returns how many it deleted.
func (s *Store) Prune(ctx context.Context, before time.Time, o PruneOptions) (int, error) {
	return use(s, "prune", func(p Pruner) (int, error) { return Prune(ctx, p, before, o) })
}

// Retention returns how long the store keeps claims (driver.Retentioner);
// false when it does not tell.
func (s *Store) Retention() (time.Duration, bool) {
	r, ok := s.store.(driver.Retentioner)
	if !ok {
		return 0, false
	}
	return r.Retention(), true
}

// Stats describes the dedup table and the claims of each consumer
// (Inspector). It counts every row, a scan of the whole table: Estimate
// is the cheap figure to ask often.
func (s *Store) Stats(ctx context.Context) (TableStats, error) {
	return use(s, "describe its table", func(in Inspector) (TableStats, error) { return in.Inspect(ctx) })
}

// Lookup reports, id for id, whether consumer's claims of ids are
// committed or in progress under a lease (Lookuper).
func (s *Store) Lookup(ctx context.Context, consumer string, ids []string) ([]ClaimInfo, error) {
	return use(s, "look up claims", func(lk Lookuper) ([]ClaimInfo, error) { return lk.Lookup(ctx, consumer, ids) })
}

// Forget deletes consumer's claims of ids, so that redeliveries of those
// messages are applied again, and returns how many it deleted (Forgetter).
func (s *Store) Forget(ctx context.Context, consumer string, ids []string) (int, error) {
	return use(s, "forget claims", func(fg Forgetter) (int, error) { return fg.Forget(ctx, consumer, ids) })
}

// Migrator is implemented by stores that create their own tables.
// Migrate is idempotent and safe when several processes run it at once.
type Migrator interface {
	Migrate(ctx context.Context) error
}

// TableStats describes a store's dedup table for operators (idemq stats, Store.Stats).
type TableStats struct {
	// Table is the dedup table's name.
	Table string
	// Rows is the number of claims kept.
	Rows int64
	// SizeBytes is the table's size on disk including indexes, as the
	// database reports it; 0 when it cannot tell.
	SizeBytes int64
	// Consumers has one entry per consumer name, sorted by name.
	Consumers []ConsumerStats
}

// ConsumerStats are the claims of one consumer.
type ConsumerStats struct {
	Consumer       string
	Rows           int64
	Oldest, Newest time.Time // zero when the consumer has leases only
	// Leases counts the consumer's claims in progress (leased, not yet
	// completed or released), and ExpiredLeases those of them whose lease
	// ran out: a holder that died, or a call outliving its lease, whose
	// message the next delivery takes over.
	Leases, ExpiredLeases int64
}

// Inspector is implemented by stores that can describe their dedup table.
type Inspector interface {
	Inspect(ctx context.Context) (TableStats, error)
}

// ClaimInfo is what a store holds for one message id of a consumer, as
// Lookup reports it to operators (idemq lookup, Store.Lookup).
type ClaimInfo struct {
	// ID is the message id looked up.
	ID string
	// Claimed reports whether a committed claim of the id exists.
	Claimed bool
	// At is when the id was claimed (the dedup table's processed_at);
	// zero when it is not claimed.
	At time.Time
	// Fingerprint is the body fingerprint stored with the claim; empty
	// when the claim had none or the id is not claimed.
	Fingerprint string
	// LeaseUntil is when the lease on an id in progress expires (a leased
	// claim, see driver.Leaser); zero when the id has no lease.
	LeaseUntil time.Time
	// LeaseToken is the fencing token of that lease.
	LeaseToken int64
}

// Lookuper is implemented by stores that can tell operators whether
// message ids are claimed. Lookup returns one ClaimInfo per id, in the
// order of ids, for the claims of consumer committed when it runs; it
// takes no locks that block claims.
type Lookuper interface {
	Lookup(ctx context.Context, consumer string, ids []string) ([]ClaimInfo, error)
}

// Forgetter is implemented by stores that can delete chosen claims, so
// that operators can have those messages applied again on purpose
// (idemq forget). Forget deletes consumer's claims of ids in one
// transaction and returns how many rows it removed; ids that are not
// claimed are skipped.
type Forgetter interface {
	Forget(ctx context.Context, consumer string, ids []string) (int, error)
}
