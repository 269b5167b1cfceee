package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
)

// producerResult is what the outbox side of a run did.
type producerResult struct {
	rows, relayed, confirmsLost int64
}

// produce is the producing service of --outbox: each payment request is
// recorded in the producer's own SQLite file together with its message, in
// one transaction (a transactional outbox), and a relay publishes the
// messages to the broker. A publish whose confirm is lost (the broker has
// the message, the relay does not know) leaves the row pending, so the
// relay publishes it again: one more copy for the consumer's dedup.
func produce(ctx context.Context, s settings, dir string, batch int, payments []payment, queue string, pub driver.Publisher) (producerResult, error) {
	var r producerResult
	path := filepath.Join(dir, fmt.Sprintf("producer-batch%d.db", batch))
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return r, err
	}
	defer db.Close()
	ob, err := sqliteoutbox.New()
	if err != nil {
		return r, err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return r, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS payment_requests
		(id TEXT PRIMARY KEY, account TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		return r, err
	}
	// The producer's requests arrive in small transactions, as from an API.
	const perTx = 50
	for i := 0; i < len(payments); i += perTx {
		if err := writeRequests(ctx, db, ob, queue, payments[i:min(i+perTx, len(payments))]); err != nil {
			return r, err
		}
	}
	r.rows = int64(len(payments))

	lossy := &confirmLoser{Publisher: pub, seed: s.seed, rate: s.loseConfirms}
	relay, err := ob.NewRelay(db, lossy, outbox.WithBatchSize(200), outbox.WithRetryBackoff(time.Millisecond, 20*time.Millisecond))
	if err != nil {
		return r, err
	}
	for {
		if _, err := relay.RunOnce(ctx); err != nil && !errors.Is(err, errConfirmLost) {
			return r, err
		}
		st, err := ob.Store(db).Stats(ctx)
		if err != nil {
			return r, err
		}
		if st.Parked > 0 {
			return r, fmt.Errorf("%d outbox rows parked: see idemq outbox list --store sqlite://%s", st.Parked, path)
		}
		if st.Pending == 0 {
			break
		}
		time.Sleep(time.Millisecond) // the rows whose confirm was lost wait out their backoff
	}
	r.relayed, r.confirmsLost = relay.Stats().Published, lossy.lost.Load()
	return r, nil
}

// writeRequests records payment requests and their messages in one
// transaction: both commit, or neither.
func writeRequests(ctx context.Context, db *sql.DB, ob *sqliteoutbox.Outbox, queue string, ps []payment) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	msgs := make([]*outbox.Message, len(ps))
	for i, p := range ps {
		if _, err := tx.ExecContext(ctx, `INSERT INTO payment_requests VALUES (?, ?, ?)`, p.ID, p.Account, p.Amount); err != nil {
			return err
		}
		body, _ := json.Marshal(p)
		msgs[i] = &outbox.Message{ID: p.ID, Destination: queue, Key: p.Account, Body: body}
	}
	if err := ob.Write(ctx, tx, msgs...); err != nil {
		return err
	}
	return tx.Commit()
}

var errConfirmLost = errors.New("injected fault: the broker's confirm was lost after it stored the message")

// confirmLoser publishes every message, then reports a seeded fraction of
// the publishes as failed, as a connection lost before the confirm would.
type confirmLoser struct {
	driver.Publisher
	seed  uint64
	rate  float64
	calls atomic.Int64
	lost  atomic.Int64
}

func (c *confirmLoser) Publish(ctx context.Context, destination string, msgs ...*driver.Message) error {
	if err := c.Publisher.Publish(ctx, destination, msgs...); err != nil {
		return err
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", c.seed, c.calls.Add(1))
	if float64(h.Sum64()%1_000_000) < c.rate*1_000_000 {
		c.lost.Add(1)
		return errConfirmLost
	}
	return nil
}
