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

// CheckConsumer is the check of a Lookup or Forget call's consumer, which
// must not be empty.
func (c *Config) CheckConsumer(op, consumer string) error {
	if consumer == "" {
		return fmt.Errorf("%s: %s: empty consumer", c.Store, op)
	}
	return nil
}

// Lookup reports, for each of ids in order, whether consumer has claimed
// it, when (processed_at) and with which fingerprint, and the lease of an
// id in progress (idemq lookup). It is a plain read: it takes no locks
// that block claims.
func (e *Engine) Lookup(ctx context.Context, consumer string, ids []string) ([]admin.ClaimInfo, error) {
	if err := e.cfg.CheckConsumer("Lookup", consumer); err != nil {
		return nil, err
	}
	found := make(map[string]admin.ClaimInfo, len(ids))
	prefix := `SELECT message_id, fingerprint, ` + e.timeText("processed_at") + ` FROM ` + e.cfg.Table +
		` WHERE consumer = ` + e.first() + ` AND message_id IN `
	for part := range slices.Chunk(ids, e.d.ListChunk) {
		q, args := e.inIDs(prefix, consumer, part)
		var id, fp []byte // VARBINARY on MySQL; TEXT converts
		var at string
		err := scanEach(ctx, e.db, q, args, func() error {
			t, err := time.ParseInLocation(timeFormat, at, time.UTC)
			found[string(id)] = admin.ClaimInfo{ID: string(id), Claimed: true, At: t, Fingerprint: string(fp)}
			return err
		}, &id, &fp, &at)
		if err != nil {
			return nil, e.cfg.Wrap("lookup", err)
		}
	}
	if err := e.lookupLeases(ctx, consumer, ids, found); err != nil {
		return nil, e.cfg.Wrap("lookup", err)
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

// Forget deletes consumer's claims and leases of ids in one transaction,
// so those messages are applied again when they come (idemq forget), and
// returns how many claims it removed.
func (e *Engine) Forget(ctx context.Context, consumer string, ids []string) (n int, err error) {
	c := e.cfg
	if err := c.CheckConsumer("Forget", consumer); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tx, err := e.db.BeginTx(ctx, nil)
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
	for part := range slices.Chunk(ids, e.d.ListChunk) {
		q, args := e.inIDs(e.unclaimSQL(), consumer, part)
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
		for part := range slices.Chunk(ids, e.d.ListChunk) {
			q, args := listIDs(false, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, part)
			if _, err := tx.ExecContext(ctx, q, args...); e.skipNoLeases(err) != nil {
				return 0, c.Wrap("forget", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, c.Wrap("forget", fmt.Errorf("commit: %w", err))
	}
	return n, nil
}
