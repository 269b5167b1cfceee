package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/internal/sqlstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// leaseDDL creates the lease table lt and its lease_until index: the
// dedup table's column types, not partitioned in either mode (leases are
// few and short-lived).
func leaseDDL(lt string) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + lt + ` (
	consumer    TEXT        NOT NULL,
	message_id  TEXT        NOT NULL,
	token       BIGINT      NOT NULL,
	fingerprint TEXT        NOT NULL DEFAULT '',
	acquired_at TIMESTAMPTZ NOT NULL,
	lease_until TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (consumer, message_id)
)`,
		`CREATE INDEX IF NOT EXISTS ` + indexName(lt, "lease_until") + ` ON ` + lt + ` (lease_until)`,
	}
}

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser), in a transaction of its own: SELECT … FOR UPDATE of the
// lease row, then INSERT … ON CONFLICT DO NOTHING of a new row (a conflict
// means a concurrent Acquire inserted it first: it is read again) or, for
// an expired row, an UPDATE with the next token; then, with the row
// locked, a look-up of the dedup table, whose completed claim wins
// (LeaseDone or LeaseMismatch, rolled back). A completion transaction that
// fenced the lease holds the row until it commits, so Acquire waits for
// it and then finds its claim. The lease table is the dedup table's name
// followed by _leases; Migrate creates it.
func (s *Store) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (lease driver.Lease, err error) {
	lt, now, until, err := s.cfg.LeaseStart("Acquire", consumer, ttl)
	if err != nil {
		return lease, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return lease, s.cfg.Wrap("acquire", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit it does nothing
	lease, err = takeLease(ctx, tx, lt, consumer, claim, now, until)
	if err != nil {
		return driver.Lease{}, s.cfg.Wrap("acquire", err)
	}
	var stored string
	err = tx.QueryRow(ctx, `SELECT fingerprint FROM `+s.cfg.Table+` WHERE consumer = $1 AND message_id = $2 LIMIT 1`, consumer, claim.ID).Scan(&stored)
	switch {
	case err == nil:
		return sqlstore.Completed(claim, stored), nil // the defer rolls back: no lease is left
	case !errors.Is(err, pgx.ErrNoRows):
		return driver.Lease{}, s.cfg.Wrap("acquire", err)
	case lease.Result != driver.LeaseWon:
		return lease, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return driver.Lease{}, s.cfg.Wrap("acquire", fmt.Errorf("commit: %w", err))
	}
	return lease, nil
}

// takeLease locks or inserts the lease row in tx: LeaseWon when it
// inserted the row or took an expired one over, LeaseBusy otherwise.
func takeLease(ctx context.Context, tx pgx.Tx, lt, consumer string, claim driver.Claim, now, until time.Time) (driver.Lease, error) {
	for try := 0; ; try++ {
		var token int64
		var expiry time.Time
		err := tx.QueryRow(ctx, `SELECT token, lease_until FROM `+lt+` WHERE consumer = $1 AND message_id = $2 FOR UPDATE`,
			consumer, claim.ID).Scan(&token, &expiry)
		if errors.Is(err, pgx.ErrNoRows) {
			token = sqlstore.FirstToken()
			tag, err := tx.Exec(ctx, `INSERT INTO `+lt+` (consumer, message_id, token, fingerprint, acquired_at, lease_until)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, message_id) DO NOTHING`, consumer, claim.ID, token, claim.Fingerprint, now, until)
			if err != nil {
				return driver.Lease{}, err
			}
			if tag.RowsAffected() == 0 && try == 0 {
				continue // another acquirer inserted the row first: read it
			}
			if tag.RowsAffected() == 0 {
				return driver.Lease{}, errors.New("lease row kept vanishing")
			}
			return driver.Lease{Result: driver.LeaseWon, Token: token, Until: until}, nil
		}
		if err != nil {
			return driver.Lease{}, err
		}
		if expiry.After(now) {
			return driver.Lease{Result: driver.LeaseBusy, Until: expiry.UTC()}, nil
		}
		_, err = tx.Exec(ctx, `UPDATE `+lt+` SET token = $3, fingerprint = $4, acquired_at = $5, lease_until = $6 WHERE consumer = $1 AND message_id = $2`,
			consumer, claim.ID, token+1, claim.Fingerprint, now, until)
		if err != nil {
			return driver.Lease{}, err
		}
		return driver.Lease{Result: driver.LeaseWon, Token: token + 1, Until: until, TakenOver: true}, nil
	}
}

// Renew moves the expiry of the leases whose tokens still hold them to ttl
// from now, in one statement (UPDATE … FROM unnest(ids, tokens) RETURNING),
// and reports ref for ref which are still held (driver.Leaser).
func (s *Store) Renew(ctx context.Context, consumer string, leases []driver.LeaseRef, ttl time.Duration) ([]bool, error) {
	lt, _, until, err := s.cfg.LeaseStart("Renew", consumer, ttl)
	if err != nil || len(leases) == 0 {
		return []bool{}, err
	}
	ids, tokens := leaseArgs(leases)
	rows, err := s.pool.Query(ctx, `UPDATE `+lt+` AS l SET lease_until = $4
FROM unnest($2::text[], $3::bigint[]) AS u(id, token)
WHERE l.consumer = $1 AND l.message_id = u.id AND l.token = u.token
RETURNING l.message_id, l.token`, customPlan, consumer, ids, tokens, until)
	held, err := heldOf(rows, err, leases)
	if err != nil {
		return nil, s.cfg.Wrap("renew", err)
	}
	return held, nil
}

// Release deletes the lease if its token still holds it (driver.Leaser).
func (s *Store) Release(ctx context.Context, consumer string, lease driver.LeaseRef) error {
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return err
	}
	if err := s.cfg.CheckConsumer("Release", consumer); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM `+lt+` WHERE consumer = $1 AND message_id = $2 AND token = $3`, consumer, lease.ID, lease.Token); err != nil {
		return s.cfg.Wrap("release", err)
	}
	return nil
}

// Fence ends the leases in this transaction (driver.Fencer) with one
// DELETE … USING unnest(ids, tokens) RETURNING, sent at once rather than
// queued: the caller needs its answer before the handler runs. The
// deleted rows stay locked until the transaction ends.
func (t *Txn) Fence(ctx context.Context, consumer string, leases []driver.LeaseRef) ([]bool, error) {
	lt, err := t.s.cfg.LeaseTable()
	if err != nil || len(leases) == 0 {
		return []bool{}, err
	}
	if err := t.s.cfg.CheckConsumer("Fence", consumer); err != nil {
		return nil, err
	}
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	ids, tokens := leaseArgs(leases)
	rows, err := t.tx.Query(ctx, `DELETE FROM `+lt+` AS l USING unnest($2::text[], $3::bigint[]) AS u(id, token)
WHERE l.consumer = $1 AND l.message_id = u.id AND l.token = u.token
RETURNING l.message_id, l.token`, customPlan, consumer, ids, tokens)
	held, err := heldOf(rows, err, leases)
	if err != nil {
		return nil, t.s.cfg.Wrap("fence", err)
	}
	return held, nil
}

// leaseArgs splits refs into the ids and tokens a statement unnests.
func leaseArgs(refs []driver.LeaseRef) (ids []string, tokens []int64) {
	ids = make([]string, len(refs))
	tokens = make([]int64, len(refs))
	for i, r := range refs {
		ids[i], tokens[i] = r.ID, r.Token
	}
	return ids, tokens
}

// heldOf reads the (message_id, token) rows a statement returned for the
// leases it found held, and reports ref for ref whether each was.
func heldOf(rows pgx.Rows, err error, refs []driver.LeaseRef) ([]bool, error) {
	if err != nil {
		return nil, err
	}
	got := make(map[driver.LeaseRef]bool, len(refs))
	var r driver.LeaseRef
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Token}, func() error { got[r] = true; return nil }); err != nil {
		return nil, err
	}
	held := make([]bool, len(refs))
	for i, ref := range refs {
		held[i] = got[ref]
	}
	return held, nil
}

// pruneLeases deletes at most limit leases that expired before the given
// time and before now, oldest first, skipping rows a transaction holds,
// and none when the lease table is missing or not the role's (noLeases).
func (s *Store) pruneLeases(ctx context.Context, before time.Time, limit int) (int, error) {
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return 0, nil // no lease table: no leases
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+lt+` WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM `+lt+` WHERE lease_until < $1 ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED))`,
		s.cfg.LeaseCut(before), limit)
	if noLeases(err) {
		return 0, nil
	}
	if err != nil {
		return 0, s.cfg.Wrap("prune", err)
	}
	return int(tag.RowsAffected()), nil
}

// lookupLeases adds the leases of ids to found (LeaseUntil, LeaseToken),
// none when the lease table is missing or not the role's (noLeases).
func (s *Store) lookupLeases(ctx context.Context, consumer string, ids []string, found map[string]admin.ClaimInfo) error {
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	rows, err := s.pool.Query(ctx, `SELECT message_id, token, lease_until FROM `+lt+` WHERE consumer = $1 AND message_id = ANY($2::text[])`,
		customPlan, consumer, ids)
	if err == nil {
		var id string
		var token int64
		var until pgtype.Timestamptz
		_, err = pgx.ForEachRow(rows, []any{&id, &token, &until}, func() error {
			info, ok := found[id]
			if !ok {
				info = admin.ClaimInfo{ID: id}
			}
			info.LeaseUntil, info.LeaseToken = until.Time.UTC(), token
			found[id] = info
			return nil
		})
	}
	if noLeases(err) {
		return nil
	}
	return err
}

// forgetLeases deletes consumer's leases of ids, none when the lease table
// is missing or not the role's (noLeases). It runs as a statement of its
// own, so that such an error cannot abort the claims' DELETE.
func (s *Store) forgetLeases(ctx context.Context, consumer string, ids []string) error {
	lt, err := s.cfg.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	_, err = s.pool.Exec(ctx, `DELETE FROM `+lt+` WHERE consumer = $1 AND message_id = ANY($2::text[])`, customPlan, consumer, ids)
	if err != nil && !noLeases(err) {
		return s.cfg.Wrap("forget", err)
	}
	return nil
}
