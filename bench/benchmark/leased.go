package benchmark

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/effects"
	"github.com/idemq/idemq/effects/effectstest"
	"github.com/idemq/idemq/stores/postgres"
)

// The leased scenario's consumers. The in-transaction one runs as many
// workers as the pool has connections (each holds one for a whole call),
// window 500; the leased one has 500 calls in flight (the window) and
// completes them in transactions of up to 50 messages, 2 at once.
const (
	leasedWindow  = 500
	leasedBatch   = 50
	leasedWorkers = 2
	// sampleEvery is how often the open transactions are counted.
	sampleEvery = 5 * time.Millisecond
)

// The names of the leased scenario's two runs.
const (
	leasedInTx   = LeasedScenario + "/in-transaction"
	leasedLeased = LeasedScenario + "/leased"
)

// leasedScenario runs the in-transaction and the leased consumer over the
// same workload (Config.N unique messages, 3,000 by default, and the
// duplicates), interleaved Repeat times, each against a fake payment
// provider of its own that answers every charge after
// Config.ProviderDelay, and records msgs/s and the transactions the
// consumer held open at once.
func (s *session) leasedScenario(ctx context.Context, rep *Report) error {
	inTx := &Result{Name: leasedInTx, Description: fmt.Sprintf("core.New, the provider called (%s) inside the dedup transaction, then a ledger row; batch 1, window %d, %d workers, pool %d",
		s.cfg.ProviderDelay, leasedWindow, s.cfg.Pool, s.cfg.Pool)}
	leased := &Result{Name: leasedLeased, Description: fmt.Sprintf("core.NewLeased, the provider called (%s) outside any transaction under a lease, the ledger row in the completion; window %d, completion batch %d × %d, pool %d",
		s.cfg.ProviderDelay, leasedWindow, leasedBatch, leasedWorkers, s.cfg.Pool)}
	rep.Results = append(rep.Results, inTx, leased)
	pg, ok := s.store.(*pgStore)
	if !ok {
		// The open transactions are counted in pg_stat_activity.
		err := errors.New("the leased scenario supports only Postgres stores")
		for _, r := range []*Result{inTx, leased} {
			r.Runs = append(r.Runs, RunResult{Error: err.Error()})
		}
		return err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	keyer, err := effects.NewKeyer(secret)
	if err != nil {
		return err
	}
	n := s.cfg.leasedN
	for rnd := 1; rnd <= s.cfg.Repeat; rnd++ {
		for _, r := range []*Result{inTx, leased} {
			s.progress("[%s] run %d of %d: %d messages, provider %s a charge, pool %d", r.Name, rnd, s.cfg.Repeat, n, s.cfg.ProviderDelay, s.cfg.Pool)
			run := s.leasedRun(ctx, pg, keyer, r.Name, n)
			s.progress("    %s; open transactions peak %d (mean %.1f over %d samples, %s of transaction per delivery), pool connections in use peak %d; %d of %d pool acquires waited for a connection, %.2fs acquiring in all",
				run.line(), run.PeakOpenTx, run.MeanOpenTx, run.Samples, fmtLatency(run.TxTimePerMsg), run.PeakPoolConns, run.PoolWaited, run.PoolAcquires, run.PoolAcquireTime.Seconds())
			r.Runs = append(r.Runs, run)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

// leasedRun runs one of the leased scenario's consumers once over n unique
// messages and the duplicates, with a fresh provider.
func (s *session) leasedRun(ctx context.Context, pg *pgStore, keyer *effects.Keyer, name string, n int) RunResult {
	prov := effectstest.NewProvider()
	defer prov.Close()
	prov.SetDelay(s.cfg.ProviderDelay)
	cl := newChargeClient(prov.URL(), keyer, leasedWindow)
	defer cl.close()
	// Set by the consumer's goroutine, read once runOne has stopped it.
	var peaks atomic.Pointer[txSampler]
	run := s.runOne(ctx, name, runSpec{
		n: n, dups: s.cfg.duplicatesOf(n),
		setup: pg.createLedger,
		consume: func(ctx context.Context, e *runEnv, t *tracker) (*counts, error) {
			c, smp, err := pg.runLeased(ctx, e, t, name, cl)
			peaks.Store(smp)
			return c, err
		},
		check: func(ctx context.Context, e *runEnv, _ int) error {
			if err := pg.checkLedger(ctx, e); err != nil {
				return err
			}
			return checkCharges(e, prov.Charges(), prov.ChargesByAccount())
		},
	})
	if peaks := peaks.Load(); peaks != nil {
		run.PeakOpenTx, run.PeakPoolConns, run.Samples = peaks.peakTx, peaks.peakConns, peaks.samples
		run.PoolAcquires, run.PoolWaited, run.PoolAcquireTime = peaks.acquires, peaks.poolWaited, peaks.acquireTime
		if peaks.samples > 0 {
			run.MeanOpenTx = float64(peaks.sumTx) / float64(peaks.samples)
			if run.Deliveries > 0 {
				// The time integral of the open transactions, per
				// delivery: what the pool spends on each message.
				run.TxTimePerMsg = time.Duration(run.MeanOpenTx * float64(peaks.elapsed) / float64(run.Deliveries))
			}
		}
		if peaks.err != nil && run.Error == "" {
			run.Error = fmt.Sprintf("sampling open transactions: %v", peaks.err)
		}
	}
	return run
}

// runLeased runs the leased scenario's consumer name until ctx ends, with
// the open transactions of its pool sampled meanwhile: in-transaction
// (core.New, the charge made in the handler, inside the dedup
// transaction) or leased (core.NewLeased, the charge as External, the
// ledger row in Complete).
func (p *pgStore) runLeased(ctx context.Context, e *runEnv, t *tracker, name string, cl *chargeClient) (*counts, *txSampler, error) {
	stages := &stageTimer{t: t}
	opts := []core.Option{
		core.WithName(e.consumer),
		core.WithLogger(e.logger),
		core.WithObserver(stages),
	}
	insert := `INSERT INTO ` + e.ledgerTable + ` (message_id, account, amount_cents, charge_id) VALUES ($1, $2, $3, $4)`
	book := func(ctx context.Context, tx pgx.Tx, m *core.Message, charge string) error {
		pay, err := decodePayment(m.Body)
		if err != nil {
			return core.Permanent(err)
		}
		_, err = tx.Exec(ctx, insert, m.ID, pay.Account, pay.AmountCents, charge)
		return err
	}
	var build consumerFor[pgx.Tx]
	if name == leasedInTx {
		opts = append(opts, core.WithBatchSize(1), core.WithWindow(leasedWindow), core.WithConcurrency(e.cfg.Pool))
		build = handlers(opts, func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
			// The call holds the transaction, and its connection, open
			// for the provider's whole answer time.
			charge, err := cl.charge(ctx, m)
			if err != nil {
				return err
			}
			return book(ctx, tx, m, charge)
		}, nil)
	} else {
		opts = append(opts, core.WithWindow(leasedWindow), core.WithBatchSize(leasedBatch), core.WithConcurrency(leasedWorkers))
		build = func(src driver.Source, store driver.Store[pgx.Tx]) (*core.Consumer[pgx.Tx], error) {
			return core.NewLeased(src, store, core.LeasedHandler[pgx.Tx, string]{External: cl.charge, Complete: book}, opts...)
		}
	}

	// The consumer's sessions carry the run's own application_name, so
	// that the sampler counts them and no other session of the database.
	app := e.consumer[:min(len(e.consumer), 63)] // NAMEDATALEN - 1
	su, err := url.Parse(p.idemqStoreURL(e.dedupTable, e.cfg.Pool))
	if err != nil {
		return nil, nil, err
	}
	q := su.Query()
	q.Set("application_name", app)
	su.RawQuery = q.Encode()

	var smp *txSampler
	c, err := runConsumer(ctx, e, su.String(), stages, build, func(store any) {
		var pool *pgxpool.Pool
		if s, ok := store.(*postgres.Store); ok {
			pool = s.Pool()
		}
		smp = p.startSampler(ctx, app, pool)
	})
	if smp != nil {
		smp.stop()
	}
	return c, smp, err
}

// txSampler counts, every sampleEvery, the transactions open in the
// sessions of one application_name (pg_stat_activity), and the
// connections the consumer's pool has acquired, and keeps the peaks.
type txSampler struct {
	cancel context.CancelFunc
	done   chan struct{}

	peakTx, peakConns int
	sumTx, samples    int64
	elapsed           time.Duration // from the first sample to the stop
	err               error
	// pool is the consumer's; its acquire counts are read at the stop.
	pool                 *pgxpool.Pool
	acquires, poolWaited int64
	acquireTime          time.Duration
}

// openTxQuery counts the transactions open (a statement running or idle
// in a transaction) in the sessions named $1. The sampler's own session
// has another name, and is left out by its pid as well.
const openTxQuery = `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND application_name = $1 AND pid <> pg_backend_pid()`

// startSampler starts sampling on a connection of the benchmark's own
// pool, held for the whole run so that a sample never waits for one;
// pool, if not nil, is the consumer's.
func (p *pgStore) startSampler(ctx context.Context, app string, pool *pgxpool.Pool) *txSampler {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &txSampler{cancel: cancel, done: make(chan struct{}), pool: pool}
	go func() {
		defer close(s.done)
		conn, err := p.pool.Acquire(sctx)
		if err != nil {
			s.err = err
			return
		}
		defer conn.Release()
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		start := time.Now()
		defer func() { s.elapsed = time.Since(start) }()
		for {
			var n int
			if err := conn.QueryRow(sctx, openTxQuery, app).Scan(&n); err != nil {
				if sctx.Err() == nil {
					s.err = err
				}
				return
			}
			s.peakTx = max(s.peakTx, n)
			s.sumTx += int64(n)
			s.samples++
			if pool != nil {
				s.peakConns = max(s.peakConns, int(pool.Stat().AcquiredConns()))
			}
			select {
			case <-tick.C:
			case <-sctx.Done():
				return
			}
		}
	}()
	return s
}

// stop ends the sampling and waits for it; the figures are final then.
func (s *txSampler) stop() {
	s.cancel()
	<-s.done
	if s.pool != nil {
		st := s.pool.Stat()
		s.acquires, s.poolWaited, s.acquireTime = st.AcquireCount(), st.EmptyAcquireCount(), st.AcquireDuration()
	}
}

// createLedger creates the run's ledger: one row per charge booked. It has
// no unique key on purpose, so that a message booked twice shows in the
// check instead of failing its transaction.
func (p *pgStore) createLedger(ctx context.Context, e *runEnv) error {
	_, err := p.pool.Exec(ctx, `CREATE TABLE `+e.ledgerTable+` (
	message_id   TEXT   NOT NULL,
	account      TEXT   NOT NULL,
	amount_cents BIGINT NOT NULL,
	charge_id    TEXT   NOT NULL)`)
	return err
}

// checkLedger is the leased scenario's exactly-once check on the
// database: one ledger row per unique id, each with a charge of its own,
// the sums per account as the workload makes them, and one completed
// claim per unique id.
func (p *pgStore) checkLedger(ctx context.Context, e *runEnv) error {
	var rows, ids, charges, claims int64
	if err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id), count(DISTINCT charge_id) FROM `+e.ledgerTable).Scan(&rows, &ids, &charges); err != nil {
		return err
	}
	want := int64(e.w.n)
	if rows != want || ids != want || charges != want {
		return fmt.Errorf("%d ledger rows for %d ids with %d charges, want %d of each (one per unique id)", rows, ids, charges, want)
	}
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.dedupTable+` WHERE consumer = $1`, e.consumer).Scan(&claims); err != nil {
		return err
	}
	if claims != want {
		return fmt.Errorf("%d completed claims in %s for consumer %s, want %d", claims, e.dedupTable, e.consumer, want)
	}
	r, err := p.pool.Query(ctx, `SELECT account, sum(amount_cents)::bigint FROM `+e.ledgerTable+` GROUP BY account`)
	if err != nil {
		return err
	}
	got, err := pgx.CollectRows(r, func(row pgx.CollectableRow) (struct {
		acc string
		sum int64
	}, error) {
		var v struct {
			acc string
			sum int64
		}
		err := row.Scan(&v.acc, &v.sum)
		return v, err
	})
	if err != nil {
		return err
	}
	sums := make(map[string]int64, len(got))
	for _, v := range got {
		sums[v.acc] = v.sum
	}
	return compareSums("ledger", e.w.expected(0), sums)
}

// checkCharges is the check on the provider's side: one charge per unique
// id, the amounts per account as the workload makes them.
func checkCharges(e *runEnv, charges int, byAccount map[string]int64) error {
	if charges != e.w.n {
		return fmt.Errorf("the provider made %d charges, want %d (one per unique id)", charges, e.w.n)
	}
	return compareSums("provider", e.w.expected(0), byAccount)
}

// compareSums compares sums per account (accounts with nothing may be
// missing) with want.
func compareSums(what string, want, got map[string]int64) error {
	wrong := 0
	var example string
	for acc, w := range want {
		if got[acc] != w {
			if wrong == 0 {
				example = fmt.Sprintf("%s has %d, want %d", acc, got[acc], w)
			}
			wrong++
		}
	}
	for acc := range got {
		if _, ok := want[acc]; !ok {
			return fmt.Errorf("%s: unknown account %q", what, acc)
		}
	}
	if wrong > 0 {
		return fmt.Errorf("%s: %d of %d accounts wrong (e.g. %s)", what, wrong, len(want), example)
	}
	return nil
}

// chargeClient charges payments through the provider's HTTP API:
// POST /charges with the message's payment and the idempotency key of
// (consumer, message id, "charge"), so that a call made again (after a
// rolled-back transaction, a lease taken over) is answered with the first
// charge.
type chargeClient struct {
	url   string
	base  *http.Transport
	http  *http.Client
	keyer *effects.Keyer
}

func newChargeClient(providerURL string, keyer *effects.Keyer, conns int) *chargeClient {
	base := http.DefaultTransport.(*http.Transport).Clone()
	// As many idle connections kept as calls run at once: with Go's
	// default of 2 a host, nearly every call of a window of 500 would open
	// a connection and close it after, measuring TCP set-up and filling
	// the port range with TIME_WAIT instead of measuring the consumer.
	base.MaxIdleConns, base.MaxIdleConnsPerHost = conns, conns
	return &chargeClient{
		url:   providerURL,
		base:  base,
		http:  &http.Client{Transport: &effects.Transport{Base: base}, Timeout: 30 * time.Second},
		keyer: keyer,
	}
}

func (c *chargeClient) close() { c.base.CloseIdleConnections() }

// charge charges m's payment and returns the charge id. PostCharge's
// errors are classified already: a refusal is permanent, a 409 (the same
// key still in flight), 429, 5xx or network error is retried.
func (c *chargeClient) charge(ctx context.Context, m *core.Message) (string, error) {
	pay, err := decodePayment(m.Body)
	if err != nil {
		return "", core.Permanent(err)
	}
	ch, err := effectstest.PostCharge(c.keyer.ForMessage(ctx, m, "charge"), c.http, c.url, pay)
	if err != nil {
		return "", fmt.Errorf("charging %s: %w", m.ID, err)
	}
	return ch.ID, nil
}
