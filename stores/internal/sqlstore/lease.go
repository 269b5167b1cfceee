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

// Acquire claims claim.ID for consumer as in progress until ttl from now
// (driver.Leaser): LeaseWon with a new token, taking over an expired lease;
// LeaseBusy while another's is live; LeaseDone or LeaseMismatch when the
// claim was completed. The lease table is the dedup table's name followed
// by _leases; Migrate creates it.
//
// It runs in one transaction of its own: it locks the lease row of
// (consumer, id) or inserts it, takes it over when it expired, and then,
// with the row lock held, looks for a completed claim in the dedup table,
// which wins (the transaction then rolls back and leaves no lease).
// Looking only after the lock matters: a completion transaction that
// fenced the lease holds the row until it commits, and its claim is then
// visible.
func (e *Engine) Acquire(ctx context.Context, consumer string, claim driver.Claim, ttl time.Duration) (lease driver.Lease, err error) {
	c := e.cfg
	if e.d.Check != nil {
		if err := e.d.Check("Acquire", consumer, []driver.Claim{claim}); err != nil {
			return lease, err
		}
	}
	lt, now, until, err := c.LeaseStart("Acquire", consumer, ttl)
	if err != nil {
		return lease, err
	}
	tx, err := e.db.BeginTx(ctx, e.d.LeaseTx)
	if err != nil {
		return lease, c.Wrap("acquire", err)
	}
	defer func() {
		if rb := tx.Rollback(); err == nil && rb != nil && !errors.Is(rb, sql.ErrTxDone) {
			err = c.Wrap("acquire", rb)
		}
	}()
	lease, err = e.takeLease(ctx, tx, lt, consumer, claim, now, until)
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
func (e *Engine) takeLease(ctx context.Context, tx *sql.Tx, lt, consumer string, claim driver.Claim, now, until time.Time) (driver.Lease, error) {
	for try := 0; ; try++ {
		var token int64
		var held string
		err := tx.QueryRowContext(ctx, `SELECT token, `+e.timeText("lease_until")+` FROM `+lt+
			` WHERE consumer = ? AND message_id = ?`+e.d.Lock, consumer, claim.ID).Scan(&token, &held)
		if errors.Is(err, sql.ErrNoRows) {
			token = FirstToken()
			_, err = tx.ExecContext(ctx, `INSERT INTO `+lt+` (consumer, message_id, token, fingerprint, acquired_at, lease_until) VALUES (?, ?, ?, ?, ?, ?)`,
				consumer, claim.ID, token, claim.Fingerprint, formatTime(now), formatTime(until))
			if err != nil && try == 0 && e.d.Errors.duplicate(err) {
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
		expiry, err := time.ParseInLocation(timeFormat, held, time.UTC)
		if err != nil {
			return driver.Lease{}, err
		}
		if expiry.After(now) {
			return driver.Lease{Result: driver.LeaseBusy, Until: expiry}, nil
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+lt+` SET token = ?, fingerprint = ?, acquired_at = ?, lease_until = ? WHERE consumer = ? AND message_id = ?`,
			token+1, claim.Fingerprint, formatTime(now), formatTime(until), consumer, claim.ID)
		if err != nil {
			return driver.Lease{}, err
		}
		return driver.Lease{Result: driver.LeaseWon, Token: token + 1, Until: until, TakenOver: true}, nil
	}
}

// Renew moves the expiry of the leases whose tokens still hold them to ttl
// from now and reports, ref for ref, which are still held (driver.Leaser).
// In one transaction of its own it locks the rows of the leases, and moves
// the expiry of those whose token still matches.
func (e *Engine) Renew(ctx context.Context, consumer string, refs []driver.LeaseRef, ttl time.Duration) (held []bool, err error) {
	c := e.cfg
	lt, _, until, err := c.LeaseStart("Renew", consumer, ttl)
	if err != nil || len(refs) == 0 {
		return []bool{}, err
	}
	tx, err := e.db.BeginTx(ctx, e.d.LeaseTx)
	if err != nil {
		return nil, c.Wrap("renew", err)
	}
	defer tx.Rollback()
	held, err = e.settle(ctx, tx, lt, consumer, refs, `UPDATE `+lt+` SET lease_until = ? WHERE consumer = ? AND message_id IN `, formatTime(until))
	if err != nil {
		return nil, c.Wrap("renew", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, c.Wrap("renew", fmt.Errorf("commit: %w", err))
	}
	return held, nil
}

// fence is End.Fence, in the caller's transaction tx: it locks the rows
// of the leases and deletes those whose token still matches, which stay
// locked until tx ends.
func (e *Engine) fence(ctx context.Context, tx *sql.Tx, consumer string, refs []driver.LeaseRef) ([]bool, error) {
	c := e.cfg
	lt, err := c.LeaseTable()
	if err != nil || len(refs) == 0 {
		return []bool{}, err
	}
	if err := c.CheckConsumer("Fence", consumer); err != nil {
		return nil, err
	}
	held, err := e.settle(ctx, tx, lt, consumer, refs, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id IN `)
	if err != nil {
		return nil, c.Wrap("fence", err)
	}
	return held, nil
}

// settle reads the lease rows of refs with a lock, reports ref by ref
// whether its token holds the lease, and runs act (a statement up to the
// list of ids, taking first, then the consumer and the ids) on the held
// ones. The lock keeps the rows as read until act ran.
func (e *Engine) settle(ctx context.Context, tx *sql.Tx, lt, consumer string, refs []driver.LeaseRef, act string, first ...any) ([]bool, error) {
	tokens := make(map[string]int64, len(refs))
	for part := range slices.Chunk(refs, e.d.ListChunk) {
		ids := make([]string, len(part))
		for i, r := range part {
			ids[i] = r.ID
		}
		q, args := listIDs(false, `SELECT message_id, token FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, ids)
		var id []byte // VARBINARY on MySQL; TEXT converts
		var token int64
		if err := scanEach(ctx, tx, q+e.d.Lock, args, func() error { tokens[string(id)] = token; return nil }, &id, &token); err != nil {
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
	for part := range slices.Chunk(ids, e.d.ListChunk) {
		q, args := listIDs(false, act, consumer, part)
		if _, err := tx.ExecContext(ctx, q, append(first, args...)...); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// Release deletes the lease if its token still holds it (driver.Leaser):
// one DELETE of the lease row.
func (e *Engine) Release(ctx context.Context, consumer string, ref driver.LeaseRef) error {
	c := e.cfg
	lt, err := c.LeaseTable()
	if err != nil {
		return err
	}
	if err := c.CheckConsumer("Release", consumer); err != nil {
		return err
	}
	if _, err := e.db.ExecContext(ctx, `DELETE FROM `+lt+` WHERE consumer = ? AND message_id = ? AND token = ?`, consumer, ref.ID, ref.Token); err != nil {
		return c.Wrap("release", err)
	}
	return nil
}

// lookupLeases adds the leases of ids to found (LeaseUntil, LeaseToken),
// when the store has a lease table it may read.
func (e *Engine) lookupLeases(ctx context.Context, consumer string, ids []string, found map[string]admin.ClaimInfo) error {
	lt, err := e.cfg.LeaseTable()
	if err != nil {
		return nil // no lease table: no leases
	}
	for part := range slices.Chunk(ids, e.d.ListChunk) {
		q, args := listIDs(false, `SELECT message_id, token, `+e.timeText("lease_until")+` FROM `+lt+` WHERE consumer = ? AND message_id IN `, consumer, part)
		var id []byte // VARBINARY on MySQL; TEXT converts
		var token int64
		var until string
		err := scanEach(ctx, e.db, q, args, func() error {
			t, err := time.ParseInLocation(timeFormat, until, time.UTC)
			info, ok := found[string(id)]
			if !ok {
				info = admin.ClaimInfo{ID: string(id)}
			}
			info.LeaseUntil, info.LeaseToken = t, token
			found[string(id)] = info
			return err
		}, &id, &token, &until)
		if err != nil {
			return e.skipNoLeases(err)
		}
	}
	return nil
}
