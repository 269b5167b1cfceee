package core_test

import (
	"context"
	"database/sql"
	"fmt"
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
	dir, _ := os.MkdirTemp("", "idemq-example")
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	store.DB().ExecContext(ctx, `CREATE TABLE ledger (message_id TEXT, amount INTEGER)`)

	broker, _ := memory.NewBroker()
	defer broker.Close()
	broker.Publish(ctx, "payments",
		&core.Message{ID: "pay-1", Body: []byte("1250")},
		&core.Message{ID: "pay-2", Body: []byte("300")},
		&core.Message{ID: "pay-1", Body: []byte("1250")}) // a redelivered duplicate
	sub, _ := broker.Subscribe("payments")

	charge := func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (?, ?)`, m.ID, string(m.Body))
		return err
	}
	c, err := core.New[*sql.Tx](sub, store, charge,
		core.WithName("payments"),
		core.WithHandlerMiddleware(recovery.New(nil), timeout.New(5*time.Second)))
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	broker.WaitIdle(ctx, "payments")
	stop()
	<-done

	var rows int
	store.DB().QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&rows)
	st := c.Stats()
	fmt.Printf("ledger rows: %d, processed: %d, duplicates: %d\n", rows, st.Processed, st.Duplicates)
	// Output: ledger rows: 2, processed: 2, duplicates: 1
}
