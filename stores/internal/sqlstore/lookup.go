package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemq/idemq/admin"
)

// Claims is where a database/sql store's Lookup and Forget find the
// claims, and its lease methods the leases: the handle, the placeholder
// style, how many ids one statement may list, and how the store's SQL
// differs. The lease statements use plain ? placeholders, which every
// driver takes.
type Claims struct {
	// DB is the store's handle.
	DB *sql.DB
	// Numbered says the driver takes numbered placeholders (?1 is the
	// consumer), as Tx.Numbered.
	Numbered bool
	// Chunk is the most ids one statement lists.
	Chunk int
	// LeaseTx are the options of the lease methods' own transactions
	// (MySQL: READ COMMITTED, so that each read after a lock sees the
	// latest commit).
	LeaseTx *sql.TxOptions
	// Lock ends a SELECT of lease rows that must lock them (" FOR
	// UPDATE"); empty where every transaction holds the write lock
	// (SQLite).
	Lock string
	// TimeText reads a time column as TimeFormat text; nil where the
	// column holds that text.
	TimeText func(col string) string
	// Taken reports an INSERT's duplicate-key error, for a lease row that
	// a concurrent Acquire inserted first; nil where that cannot happen.
	Taken func(error) bool
	// NoLeases reports an error that says the lease table is not there
	// (Migrate has not run since leases came) or not the role's to use:
	// Prune, Lookup and Forget then pass the leases by, so a store that
	// never leases keeps working.
	NoLeases func(error) bool
}

// SkipNoLeases returns nil for an error of cl.NoLeases, err otherwise.
func (cl Claims) SkipNoLeases(err error) error {
	if err != nil && cl.NoLeases != nil && cl.NoLeases(err) {
		return nil
	}
	return err
}

// CheckConsumer is the check of a Lookup or Forget call's consumer, which
// must not be empty.
func (c *Config) CheckConsumer(op, consumer string) error {
	if consumer == "" {
		return fmt.Errorf("%s: %s: empty consumer", c.Store, op)
	}
	return nil
}

// Lookup is a database/sql store's Lookup. prefix is the SELECT up to the
// list of ids ("SELECT message_id, fingerprint, processed_at FROM t WHERE
// consumer = ? AND message_id IN "), returning processed_at as TimeFormat
// text. It returns one ClaimInfo per id, in order, with the lease of each
// id that has one.
func (c *Config) Lookup(ctx context.Context, cl Claims, prefix, consumer string, ids []string) ([]admin.ClaimInfo, error) {
	if err := c.CheckConsumer("Lookup", consumer); err != nil {
		return nil, err
	}
	found := make(map[string]admin.ClaimInfo, len(ids))
	for part := range slices.Chunk(ids, cl.Chunk) {
		q, args := InIDs(cl.Numbered, prefix, consumer, part)
		if err := scanInfos(ctx, cl.DB, q, args, found); err != nil {
			return nil, c.Wrap("lookup", err)
		}
	}
	if err := c.lookupLeases(ctx, cl, consumer, ids, found); err != nil {
		return nil, c.Wrap("lookup", err)
	}
	return InOrder(ids, found), nil
}

// InOrder returns the ClaimInfo of each id from found, in the order of
// ids; an id found lacks is reported unclaimed.
func InOrder(ids []string, found map[string]admin.ClaimInfo) []admin.ClaimInfo {
	out := make([]admin.ClaimInfo, len(ids))
	for i, id := range ids {
		if info, ok := found[id]; ok {
			out[i] = info
		} else {
			out[i] = admin.ClaimInfo{ID: id}
		}
	}
	return out
}

func scanInfos(ctx context.Context, db *sql.DB, q string, args []any, found map[string]admin.ClaimInfo) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, fp []byte // VARBINARY on MySQL; TEXT converts
		var at string
		if err := rows.Scan(&id, &fp, &at); err != nil {
			return err
		}
		t, err := time.ParseInLocation(TimeFormat, at, time.UTC)
		if err != nil {
			return err
		}
		found[string(id)] = admin.ClaimInfo{ID: string(id), Claimed: true, At: t, Fingerprint: string(fp)}
	}
	return rows.Err()
}

// Forget is a database/sql store's Forget. prefix is the DELETE up to the
// list of ids ("DELETE FROM t WHERE consumer = ? AND message_id IN "). It
// deletes in one transaction, Chunk ids per statement, the ids' leases
// too, and returns how many claims it removed.
func (c *Config) Forget(ctx context.Context, cl Claims, prefix, consumer string, ids []string) (n int, err error) {
	if err := c.CheckConsumer("Forget", consumer); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tx, err := cl.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, c.Wrap("forget", err)
	}
	defer func() {
		if err != nil {
			if rb := tx.Rollback(); rb != nil && !errors.Is(rb, sql.ErrTxDone) {
				err = errors.Join(err, rb)
			}
			n = 0
		}
	}()
	for part := range slices.Chunk(ids, cl.Chunk) {
		q, args := InIDs(cl.Numbered, prefix, consumer, part)
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, c.Wrap("forget", err)
		}
		m, err := res.RowsAffected()
		if err != nil {
			return 0, c.Wrap("forget", err)
		}
		n += int(m)
	}
	if lt, err := c.LeaseTable(); err == nil {
		for part := range slices.Chunk(ids, cl.Chunk) {
			q, args := InIDs(false, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, part)
			if _, err := tx.ExecContext(ctx, q, args...); cl.SkipNoLeases(err) != nil {
				return 0, c.Wrap("forget", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, c.Wrap("forget", fmt.Errorf("commit: %w", err))
	}
	return n, nil
}
