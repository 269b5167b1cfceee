package postgres_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/postgres"
)

// Claim a message id and apply the business effect in the same
// transaction; a redelivery of the id loses the claim and changes nothing.
func ExampleOpen() {
	ctx := context.Background()
	store, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:5432/test", postgres.WithTable("inbox"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	txn, err := store.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer txn.Rollback(ctx) // a no-op after Commit
	res, err := txn.Claim(ctx, "billing", []driver.Claim{{ID: "order-42", Fingerprint: core.Fingerprint([]byte(`{"amount":10}`))}})
	if err != nil {
		log.Fatal(err)
	}
	if res[0] == driver.ClaimWon {
		if _, err := txn.Tx().Exec(ctx, `UPDATE balances SET amount = amount + 10 WHERE account = 'alice'`); err != nil {
			log.Fatal(err)
		}
	}
	if err := txn.Commit(ctx); err != nil {
		log.Fatal(err) // retry later: postgres.IsTransient(err) tells a lost connection from a bug
	}
	fmt.Println(res[0])
}

// Share a service's pool with the store, and prune old claims in the
// background.
func ExampleNew() {
	ctx := context.Background()
	store, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	shared, err := postgres.New(store.Pool(), postgres.WithTable("orders_inbox"))
	if err != nil {
		log.Fatal(err)
	}
	if err := shared.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	go shared.RunPruner(ctx, time.Minute, 1000, nil)
}
