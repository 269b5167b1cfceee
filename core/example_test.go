package core_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/middleware/recovery"
	"github.com/idemq/idemq/middleware/timeout"
	"github.com/idemq/idemq/stores/sqlite"
)

// A consumer that applies each payment once, although the broker delivers
// one of them twice.
func ExampleNew() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemq-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE ledger (message_id TEXT, amount INTEGER)`); err != nil {
		log.Fatal(err)
	}

	broker, err := memory.NewBroker()
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	err = core.NewPublisher(broker).Publish(ctx, "payments",
		&core.Message{ID: "pay-1", Body: []byte("1250")},
		&core.Message{ID: "pay-2", Body: []byte("300")},
		&core.Message{ID: "pay-1", Body: []byte("1250")}) // a redelivered duplicate
	if err != nil {
		log.Fatal(err)
	}
	sub, err := broker.Subscribe("payments")
	if err != nil {
		log.Fatal(err)
	}

	charge := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (?, ?)`, m.ID, string(m.Body))
		return err
	}
	c, err := core.New[*sql.Tx](sub, store, charge,
		core.WithName("payments"),
		core.WithHandlerMiddleware(recovery.New(nil), timeout.New(5*time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	if err := broker.WaitIdle(ctx, "payments"); err != nil {
		log.Fatal(err)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	var rows int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	st := c.Stats()
	fmt.Printf("ledger rows: %d, processed: %d, duplicates: %d\n", rows, st.Processed, st.Duplicates)
	// Output: ledger rows: 2, processed: 2, duplicates: 1
}
