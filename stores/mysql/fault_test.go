//go:build faults

package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"

	_ "github.com/idemq/idemq/brokers/rabbitmq" // amqp:// for core.OpenSource
)

// TestFaultMariaDBRestart consumes 5,000 ids (plus 20% duplicates) from
// RabbitMQ into a private MariaDB server that is shut down (SIGTERM) a
// third of the way through and started again on the same port: the
// Consumer, never restarted, goes on once database/sql reconnects, and
// every id is applied exactly once.
func TestFaultMariaDBRestart(t *testing.T) {
	srv := servicetest.StartMariaDB(t)
	ctx := context.Background()
	s, err := mysql.Open(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db := s.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (id VARCHAR(64) NOT NULL, account VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	servicetest.RunFaultScenario(t, servicetest.FaultScenario[*sql.Tx]{
		Scenario: "mariadb restart (SIGTERM)", StoreName: "mariadb", Unique: 5000, Store: s,
		Apply: func(ctx context.Context, tx *sql.Tx, e servicetest.Effect) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, account, amount) VALUES (?, ?, ?)`, e.ID, e.Account, e.Amount)
			return err
		},
		IsTransient: mysql.IsTransient,
		Effects: func(ctx context.Context) ([]servicetest.Effect, error) {
			rows, err := db.QueryContext(ctx, `SELECT id, account, amount FROM effects`)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			var out []servicetest.Effect
			for rows.Next() {
				var e servicetest.Effect
				if err := rows.Scan(&e.ID, &e.Account, &e.Amount); err != nil {
					return nil, err
				}
				out = append(out, e)
			}
			return out, rows.Err()
		},
		Fault: func(down func()) {
			srv.Stop()
			down()
			time.Sleep(500 * time.Millisecond)
			srv.Start()
		},
	})
}
