package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/sqlident"
)

// LeaseSuffix ends the name of the lease table next to a dedup table.
const LeaseSuffix = "_leases"

// LeaseTable returns the name of the table that holds the leases
// (driver.Leaser) next to the dedup table, or an error naming WithTable
// when that name would pass the identifier limit. Only leasing needs the
// table: Migrate skips it and Lookup, Forget and Prune ignore it then, so
// a store that never leases keeps working with such a name.
func (c *Config) LeaseTable() (string, error) {
	name := c.Table + LeaseSuffix
	if sqlident.Check(name) != nil { // c.Table passed it: only the length can fail
		return "", fmt.Errorf("%s: WithTable: table name is %d characters long, at most %d allowed for leasing (its lease table adds %s)",
			c.Store, len(c.Table), sqlident.MaxLength-len(LeaseSuffix), LeaseSuffix)
	}
	return name, nil
}

// LeaseCut is the time before which Prune deletes leases: before, but
// never later than now, so that no live lease goes whatever the cut.
func (c *Config) LeaseCut(before time.Time) time.Time {
	if now := c.Now(); now.Before(before) {
		return now
	}
	return before
}

// LeaseStart checks an Acquire or Renew call and returns its lease table,
// the store's time and the new expiry.
func (c *Config) LeaseStart(op, consumer string, ttl time.Duration) (table string, now, until time.Time, err error) {
	if table, err = c.LeaseTable(); err != nil {
		return "", now, until, err
	}
	if err = c.CheckConsumer(op, consumer); err != nil {
		return "", now, until, err
	}
	if ttl <= 0 {
		return "", now, until, fmt.Errorf("%s: %s: ttl must be positive, got %v", c.Store, op, ttl)
	}
	now = c.Now()
	return table, now, now.Add(ttl), nil
}

// FirstToken is the fencing token of a lease row inserted anew; a takeover
// adds one. It is random rather than 1, so that a holder whose lease row
// was released or fenced and then inserted again by another acquirer does
// not find its old token valid again. It leaves room for 2^62 takeovers.
func FirstToken() int64 { return rand.Int64N(1<<62) + 1 }

// Completed is Acquire's answer when a completed claim of c.ID exists
// with the stored fingerprint: LeaseDone, or LeaseMismatch as
// driver.ClassifyStored has it.
func Completed(c driver.Claim, stored string) driver.Lease {
	if driver.ClassifyStored(c.Fingerprint, stored) == driver.ClaimMismatch {
		return driver.Lease{Result: driver.LeaseMismatch}
	}
	return driver.Lease{Result: driver.LeaseDone}
}

// Acquire is a database/sql store's Acquire, in one transaction of its
// own: it locks the lease row of (consumer, id) or inserts it, takes it
// over when it expired, and then, with the row lock held, looks for a
// completed claim in the dedup table, which wins (the transaction then
// rolls back and leaves no lease). Looking only after the lock matters: a
// completion transaction that fenced the lease holds the row until it
// commits, and its claim is then visible.
func (c *Config) Acquire(ctx context.Context, cl Claims, consumer string, claim driver.Claim, ttl time.Duration) (lease driver.Lease, err error) {
	lt, now, until, err := c.LeaseStart("Acquire", consumer, ttl)
	if err != nil {
		return lease, err
	}
	tx, err := cl.DB.BeginTx(ctx, cl.LeaseTx)
	if err != nil {
		return lease, c.Wrap("acquire", err)
	}
	defer func() {
		if rb := tx.Rollback(); err == nil && rb != nil && !errors.Is(rb, sql.ErrTxDone) {
			err = c.Wrap("acquire", rb)
		}
	}()
	lease, err = c.takeLease(ctx, tx, cl, lt, consumer, claim, now, until)
	if err != nil {
		return driver.Lease{}, c.Wrap("acquire", err)
	}
	var stored string
	err = tx.QueryRowContext(ctx, `SELECT fingerprint FROM `+c.Table+` WHERE consumer = ? AND message_id = ?`, consumer, claim.ID).Scan(&stored)
	switch {
	case err == nil:
		return Completed(claim, stored), nil // the defer rolls back: no lease is left
	case !errors.Is(err, sql.ErrNoRows):
		return driver.Lease{}, c.Wrap("acquire", err)
	case lease.Result != driver.LeaseWon:
		return lease, nil
	}
	if err := tx.Commit(); err != nil {
		return driver.Lease{}, c.Wrap("acquire", fmt.Errorf("commit: %w", err))
	}
	return lease, nil
}

// takeLease locks or inserts the lease row in tx: LeaseWon when it
// inserted the row or took an expired one over, LeaseBusy otherwise.
func (c *Config) takeLease(ctx context.Context, tx *sql.Tx, cl Claims, lt, consumer string, claim driver.Claim, now, until time.Time) (driver.Lease, error) {
	for try := 0; ; try++ {
		var token int64
		var held string
		err := tx.QueryRowContext(ctx, `SELECT token, `+cl.timeText("lease_until")+` FROM `+lt+
			` WHERE consumer = ? AND message_id = ?`+cl.Lock, consumer, claim.ID).Scan(&token, &held)
		if errors.Is(err, sql.ErrNoRows) {
			token = FirstToken()
			_, err = tx.ExecContext(ctx, `INSERT INTO `+lt+` (consumer, message_id, token, fingerprint, acquired_at, lease_until) VALUES (?, ?, ?, ?, ?, ?)`,
				consumer, claim.ID, token, claim.Fingerprint, FormatTime(now), FormatTime(until))
			if err != nil && try == 0 && cl.Taken != nil && cl.Taken(err) {
				continue // another acquirer inserted the row first: read it
			}
			if err != nil {
				return driver.Lease{}, err
			}
			return driver.Lease{Result: driver.LeaseWon, Token: token, Until: until}, nil
		}
		if err != nil {
			return driver.Lease{}, err
		}
		expiry, err := time.ParseInLocation(TimeFormat, held, time.UTC)
		if err != nil {
			return driver.Lease{}, err
		}
		if expiry.After(now) {
			return driver.Lease{Result: driver.LeaseBusy, Until: expiry}, nil
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+lt+` SET token = ?, fingerprint = ?, acquired_at = ?, lease_until = ? WHERE consumer = ? AND message_id = ?`,
			token+1, claim.Fingerprint, FormatTime(now), FormatTime(until), consumer, claim.ID)
		if err != nil {
			return driver.Lease{}, err
		}
		return driver.Lease{Result: driver.LeaseWon, Token: token + 1, Until: until, TakenOver: true}, nil
	}
}

// Renew is a database/sql store's Renew, in one transaction of its own:
// it locks the rows of the leases, and moves the expiry of those whose
// token still matches.
func (c *Config) Renew(ctx context.Context, cl Claims, consumer string, refs []driver.LeaseRef, ttl time.Duration) (held []bool, err error) {
	lt, _, until, err := c.LeaseStart("Renew", consumer, ttl)
	if err != nil || len(refs) == 0 {
		return []bool{}, err
	}
	tx, err := cl.DB.BeginTx(ctx, cl.LeaseTx)
	if err != nil {
		return nil, c.Wrap("renew", err)
	}
	defer tx.Rollback()
	held, err = c.settle(ctx, tx, cl, lt, consumer, refs, `UPDATE `+lt+` SET lease_until = ? WHERE consumer = ? AND message_id IN `, FormatTime(until))
	if err != nil {
		return nil, c.Wrap("renew", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, c.Wrap("renew", fmt.Errorf("commit: %w", err))
	}
	return held, nil
}

// Fence is a database/sql store's Txn.Fence, in the caller's transaction
// tx: it locks the rows of the leases and deletes those whose token still
// matches, which stay locked until tx ends.
func (c *Config) Fence(ctx context.Context, tx *sql.Tx, cl Claims, consumer string, refs []driver.LeaseRef) ([]bool, error) {
	lt, err := c.LeaseTable()
	if err != nil || len(refs) == 0 {
		return []bool{}, err
	}
	if err := c.CheckConsumer("Fence", consumer); err != nil {
		return nil, err
	}
	held, err := c.settle(ctx, tx, cl, lt, consumer, refs, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id IN `)
	if err != nil {
		return nil, c.Wrap("fence", err)
	}
	return held, nil
}

// settle reads the lease rows of refs with a lock, reports ref by ref
// whether its token holds the lease, and runs act (a statement up to the
// list of ids, taking first, then the consumer and the ids) on the held
// ones. The lock keeps the rows as read until act ran.
func (c *Config) settle(ctx context.Context, tx *sql.Tx, cl Claims, lt, consumer string, refs []driver.LeaseRef, act string, first ...any) ([]bool, error) {
	tokens := make(map[string]int64, len(refs))
	for part := range slices.Chunk(refs, cl.Chunk) {
		ids := make([]string, len(part))
		for i, r := range part {
			ids[i] = r.ID
		}
		q, args := InIDs(false, `SELECT message_id, token FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, ids)
		rows, err := tx.QueryContext(ctx, q+cl.Lock, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id []byte // VARBINARY on MySQL; TEXT converts
			var token int64
			if err := rows.Scan(&id, &token); err != nil {
				rows.Close()
				return nil, err
			}
			tokens[string(id)] = token
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	held := make([]bool, len(refs))
	var ids []string
	for i, r := range refs {
		if token, ok := tokens[r.ID]; ok && token == r.Token {
			held[i] = true
			ids = append(ids, r.ID)
		}
	}
	for part := range slices.Chunk(ids, cl.Chunk) {
		q, args := InIDs(false, act, consumer, part)
		if _, err := tx.ExecContext(ctx, q, append(first, args...)...); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// Release is a database/sql store's Release: one DELETE of the lease row
// if token still holds it.
func (c *Config) Release(ctx context.Context, cl Claims, consumer string, ref driver.LeaseRef) error {
	lt, err := c.LeaseTable()
	if err != nil {
		return err
	}
	if err := c.CheckConsumer("Release", consumer); err != nil {
		return err
	}
	if _, err := cl.DB.ExecContext(ctx, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id = ? AND token = ?`, consumer, ref.ID, ref.Token); err != nil {
		return c.Wrap("release", err)
	}
	return nil
}

// lookupLeases adds the leases of ids to found (LeaseUntil, LeaseToken),
// when the store has a lease table it may read.
func (c *Config) lookupLeases(ctx context.Context, cl Claims, consumer string, ids []string, found map[string]admin.ClaimInfo) error {
	lt, err := c.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	for part := range slices.Chunk(ids, cl.Chunk) {
		q, args := InIDs(false, `SELECT message_id, token, `+cl.timeText("lease_until")+` FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, part)
		rows, err := cl.DB.QueryContext(ctx, q, args...)
		if err != nil {
			return cl.SkipNoLeases(err)
		}
		for rows.Next() {
			var id []byte // VARBINARY on MySQL; TEXT converts
			var token int64
			var until string
			if err := rows.Scan(&id, &token, &until); err != nil {
				rows.Close()
				return err
			}
			t, err := time.ParseInLocation(TimeFormat, until, time.UTC)
			if err != nil {
				rows.Close()
				return err
			}
			info, ok := found[string(id)]
			if !ok {
				info = admin.ClaimInfo{ID: string(id)}
			}
			info.LeaseUntil, info.LeaseToken = t, token
			found[string(id)] = info
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// timeText reads the time column col as TimeFormat text.
func (cl Claims) timeText(col string) string {
	if cl.TimeText == nil {
		return col
	}
	return cl.TimeText(col)
}

// Leaser is the lease half of a database/sql store (driver.Leaser), which
// mysql and sqlite embed: each method runs in a short transaction of its
// own on Claims (see Config.Acquire, Renew and Release for the steps).
type Leaser struct {
	Cfg    *Config
	Claims Claims
}

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser): LeaseWon with a new token, taking over an expired lease;
// LeaseBusy while another's is live; LeaseDone or LeaseMismatch when the
// claim was completed. The lease table is the dedup table's name followed
// by _leases; Migrate creates it.
func (l *Leaser) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (driver.Lease, error) {
	return l.Cfg.Acquire(ctx, l.Claims, consumer, claim, ttl)
}

// Renew moves the expiry of the leases whose tokens still hold them to ttl
// from now and reports, ref for ref, which are still held (driver.Leaser).
func (l *Leaser) Renew(ctx context.Context, consumer string, leases []driver.LeaseRef, ttl time.Duration) ([]bool, error) {
	return l.Cfg.Renew(ctx, l.Claims, consumer, leases, ttl)
}

// Release deletes the lease if its token still holds it (driver.Leaser).
func (l *Leaser) Release(ctx context.Context, consumer string, lease driver.LeaseRef) error {
	return l.Cfg.Release(ctx, l.Claims, consumer, lease)
}
