//go:build faults

package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	_ "github.com/idemq/idemq/brokers/rabbitmq" // amqp:// for core.OpenSource
)

// faultMessages is how many distinct ids each fault scenario publishes
// (plus 20% duplicates).
const faultMessages = 5000

// faultScenario runs the scenario over a store opened by url; the effects
// are read back through url too (from the server that takes writes after
// the fault).
func faultScenario(t *testing.T, name, storeName, url string, fault func(down func())) {
	ctx := context.Background()
	// A store URL as a deployment gives it: pgx's parameters (multi-host,
	// target_session_attrs) pass through core.OpenStore.
	st, err := core.OpenStore[pgx.Tx](ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.(interface{ Close() error }).Close()
	var pool *pgxpool.Pool
	if !st.As(&pool) {
		t.Fatal("no pool behind the store")
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	servicetest.RunFaultScenario(t, servicetest.FaultScenario[pgx.Tx]{
		Scenario: name, StoreName: storeName, Unique: faultMessages, Store: st,
		Apply: func(ctx context.Context, tx pgx.Tx, e servicetest.Effect) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (id, account, amount) VALUES ($1, $2, $3)`, e.ID, e.Account, e.Amount)
			return err
		},
		IsTransient: postgres.IsTransient,
		Effects: func(ctx context.Context) ([]servicetest.Effect, error) {
			// A connection of its own: the store's pool may still be
			// finding its way after the fault.
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return nil, err
			}
			defer conn.Close(ctx)
			rows, err := conn.Query(ctx, `SELECT id, account, amount FROM effects`)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, func(r pgx.CollectableRow) (servicetest.Effect, error) {
				var e servicetest.Effect
				return e, r.Scan(&e.ID, &e.Account, &e.Amount)
			})
		},
		Fault: fault,
	})
}

// TestFaultPostgresFailover consumes through a store opened by the
// multi-host URL of a private primary and its synchronous standby; a
// third of the way through, the primary crashes (immediate stop) and the
// standby is promoted. The Consumer, never restarted, must go on against
// the new primary by itself: every id applied exactly once there, exact
// balances, nothing dead-lettered or left in the queue.
func TestFaultPostgresFailover(t *testing.T) {
	pair := servicetest.StartPostgresPair(t, true)
	faultScenario(t, "postgres failover (primary crash, sync standby promoted)", "postgres multi-host sync", pair.URL,
		func(down func()) {
			pair.StopPrimary()
			down()
			// The time a failover manager takes to notice and promote.
			time.Sleep(500 * time.Millisecond)
			pair.Promote()
		})
}

// TestFaultPostgresRestart restarts a private server (fast shutdown,
// then start on the same port) a third of the way through: the pool
// reconnects by itself and every id is applied exactly once.
func TestFaultPostgresRestart(t *testing.T) {
	srv := servicetest.StartPostgres(t)
	faultScenario(t, "postgres restart (fast shutdown)", "postgres", srv.URL,
		func(down func()) {
			srv.Stop()
			down()
			time.Sleep(500 * time.Millisecond)
			srv.Start()
		})
}
