package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/sqlite"
)

// Open a file database, claim a message id and apply the business effect in
// the same transaction; the redelivery of the same id is a duplicate.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "idemq-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.WithTable("inbox"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	store.DB().Exec(`CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER)`)
	store.DB().Exec(`INSERT INTO balances VALUES ('alice', 0)`)

	for attempt := 1; attempt <= 2; attempt++ {
		txn, _ := store.Begin(ctx)
		res, _ := txn.Claim(ctx, "billing", []driver.Claim{{ID: "order-42"}})
		if res[0] == driver.ClaimWon {
			txn.Tx().ExecContext(ctx, `UPDATE balances SET amount = amount + 10 WHERE account = 'alice'`)
		}
		txn.Commit(ctx)
		fmt.Println("delivery", attempt, res[0])
	}
	var amount int
	store.DB().QueryRow(`SELECT amount FROM balances WHERE account = 'alice'`).Scan(&amount)
	fmt.Println("balance", amount)
	// Output:
	// delivery 1 won
	// delivery 2 duplicate
	// balance 10
}
