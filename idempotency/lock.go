package idempotency

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// busyWait is how long a request waits for a copy's transaction that
// holds the key's claim before it is answered 409: a copy arriving as the
// first commits gets the stored response rather than a 409.
const busyWait = 100 * time.Millisecond

// runLocked decides the key and runs h in one transaction on
// PostgreSQL: its claim, sent with BEGIN, tells a new key from a completed
// or reused one and, meeting a copy's claim not yet committed, fails at
// once (driver.BusyClaimer) instead of waiting for it; h's effect and the
// response commit with the claim. A copy in progress is answered 409; an
// uncommitted claim ends with its transaction, so a request that failed,
// panicked or whose process died holds the key no longer.
func (m *Middleware[Tx]) runLocked(w http.ResponseWriter, r *http.Request, h inner[Tx], claim driver.Claim) {
	ctx := r.Context()
	txn, err := m.store.Begin(ctx)
	if err != nil {
		m.storeFailed(w, "beginning the transaction", err)
		return
	}
	// Every answer but the handler's is written after the rollback, so a
	// retry finds the key free; the deferred one covers a panic of h.
	defer m.rollback(ctx, txn)
	bc, ok := txn.(driver.BusyClaimer)
	if !ok {
		m.rollback(ctx, txn)
		m.storeFailed(w, "claiming the key", fmt.Errorf("the store's transaction %T cannot claim without waiting (driver.BusyClaimer)", txn))
		return
	}
	won, err := bc.ClaimOrBusy(ctx, m.cfg.name, []driver.Claim{claim}, busyWait)
	if errors.Is(err, driver.ErrClaimBusy) {
		m.rollback(ctx, txn)
		inProgress(w, runningRetryAfter) // a claim in progress tells that the key is held, not for how long
		return
	}
	if err == nil && len(won) != 1 {
		err = fmt.Errorf("store decided %d of 1 claim", len(won))
	}
	if err != nil {
		m.rollback(ctx, txn)
		m.storeFailed(w, "claiming the key", err)
		return
	}
	switch won[0] {
	case driver.ClaimWon:
	case driver.ClaimDuplicate:
		st, ok := txn.(driver.SQLTxn)
		if !ok {
			m.rollback(ctx, txn)
			m.storeFailed(w, "reading the stored response", fmt.Errorf("the store's transactions (%T) cannot read it (driver.SQLTxn)", txn))
			return
		}
		s, found, err := m.tab.get(ctx, st, m.cfg.name, claim.ID)
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
	if err := h.call(rec, r, txn.Tx()); err != nil {
		m.rollback(ctx, txn)
		m.handlerFailed(ctx, w, rec, err, retryDetail)
		return
	}
	m.commitAndSend(ctx, w, txn, claim.ID, rec, "completing the key", func() { m.rollback(ctx, txn) })
}
