package idempotency

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lockRetryAfter is the Retry-After, in seconds, of a 409 on PostgreSQL:
// an advisory lock tells that the key is held, not for how long.
const lockRetryAfter = 1

// lockSQL takes the key's advisory lock if no other transaction holds it;
// the lock ends with the transaction.
const lockSQL = `SELECT pg_try_advisory_xact_lock($1)`

// lockKey is the advisory lock key of id claimed under consumer: FNV-64a
// of a prefix of its own (the Postgres store's lock keys hash other
// prefixes), the consumer's length, the consumer and the id, so no two
// (consumer, id) pairs share a text.
func lockKey(consumer, id string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemq.idempotency."))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(consumer)))
	h.Write(n[:])
	h.Write([]byte(consumer))
	h.Write([]byte(id))
	return int64(h.Sum64())
}

// runLocked decides the key and runs h in one transaction on
// PostgreSQL: its first statement takes the key's advisory lock, its
// claim tells a new key from a completed or reused one, and h's effect
// and the response commit with the claim. A copy whose lock is taken is
// answered 409; the lock ends with the transaction, so a request that
// failed, panicked or whose process died holds the key no longer.
//
// again is set for the second attempt after a claim refused for want of
// the UPDATE privilege (see plainClaims).
func (m *Middleware[Tx]) runLocked(w http.ResponseWriter, r *http.Request, h HandlerFunc[Tx], claim driver.Claim, again bool) {
	ctx := r.Context()
	txn, err := m.store.Begin(ctx)
	if err != nil {
		m.storeFailed(w, "beginning the transaction", err)
		return
	}
	// Every answer but the handler's is written after the rollback, so a
	// retry finds the key free; the deferred one covers a panic of h.
	defer m.rollback(ctx, txn)
	tx := any(txn.Tx()).(pgx.Tx)
	var got bool
	if err := tx.QueryRow(ctx, lockSQL, lockKey(m.cfg.name, claim.ID)).Scan(&got); err != nil {
		m.rollback(ctx, txn)
		m.storeFailed(w, "locking the key", err)
		return
	}
	if !got {
		m.rollback(ctx, txn)
		inProgress(w, lockRetryAfter)
		return
	}
	won, err := txn.Claim(ctx, m.cfg.name, []driver.Claim{claim})
	if err == nil && len(won) != 1 {
		err = fmt.Errorf("store decided %d of 1 claim", len(won))
	}
	if err != nil && !again && m.plainClaims(ctx, err) {
		m.rollback(ctx, txn)
		m.runLocked(w, r, h, claim, true)
		return
	}
	if err != nil {
		m.rollback(ctx, txn)
		m.storeFailed(w, "claiming the key", err)
		return
	}
	switch won[0] {
	case driver.ClaimWon:
	case driver.ClaimDuplicate:
		s, found, err := m.tab.get(ctx, tx, m.cfg.name, claim.ID)
		m.rollback(ctx, txn)
		m.answerStored(w, s, found, err)
		return
	case driver.ClaimMismatch:
		m.rollback(ctx, txn)
		mismatch(w)
		return
	default:
		m.rollback(ctx, txn)
		m.storeFailed(w, "claiming the key", fmt.Errorf("unknown claim result %v", won[0]))
		return
	}
	rec := newRecorder()
	if err := h(rec, r, txn.Tx()); err != nil {
		m.rollback(ctx, txn)
		m.cfg.logger.ErrorContext(ctx, "idempotency: handler failed; nothing was stored", "consumer", m.cfg.name, "err", err)
		writeProblem(w, http.StatusInternalServerError, problemFailed, "The request failed",
			"nothing was applied; retry with the same Idempotency-Key", 0)
		return
	}
	res := rec.result(m.cfg.headers)
	err = m.tab.put(ctx, txn.Tx(), m.cfg.name, claim.ID, res, time.Now())
	if err == nil {
		if fc, ok := txn.(driver.FlushCommitter); ok {
			err = fc.FlushCommit(ctx)
		} else {
			err = txn.Commit(ctx)
		}
	}
	if err != nil {
		m.rollback(ctx, txn)
		m.storeFailed(w, "completing the key", err)
		return
	}
	if m.afterCommit != nil {
		m.afterCommit()
	}
	send(w, rec.header, res.status, res.body)
}

// probeID is the id plainClaims claims, and rolls back, under the
// middleware's name.
const probeID = "idemq.idempotency.privilege-probe"

// plainClaims reports whether err, a claim's error, is insufficient_privilege
// (42501: a role granted SELECT, INSERT and DELETE on the claims table, no
// UPDATE) and the store now claims without UPDATE. The Postgres store
// switches to such claims when its first statement in a transaction is
// refused so, which the locked claim never is (the lock goes first): a
// claim in a transaction of its own, rolled back, makes it switch.
func (m *Middleware[Tx]) plainClaims(ctx context.Context, err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return false
	}
	txn, err := m.store.Begin(ctx)
	if err != nil {
		return false
	}
	defer m.rollback(ctx, txn)
	_, err = txn.Claim(ctx, m.cfg.name, []driver.Claim{{ID: probeID}})
	return err == nil
}
