package kafkashare_test

import (
	"context"
	"database/sql"
	"log"

	_ "github.com/idemq/idemq/brokers/kafkashare"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// A Consumer of a share group, opened by URL: importing kafkashare
// registers kafka+share://.
func Example() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "kafka+share://localhost:9092/payments?group=payments")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "/var/lib/app/dedup.db")
	if err != nil {
		log.Fatal(err)
	}
	c, err := core.New[*sql.Tx](src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (payment_id, body) VALUES (?, ?)", m.ID, m.Body)
		return err
	}, core.WithName("payments"))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(ctx))
}
