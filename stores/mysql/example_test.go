package mysql_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/stores/mysql"
)

// Claim a message id and apply the business effect in the same
// transaction; a redelivery of the id loses the claim and changes nothing.
func ExampleOpen() {
	ctx := context.Background()
	store, err := mysql.Open(ctx, "mysql://root@127.0.0.1:3306/test", mysql.WithTable("inbox"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	go store.RunPruner(ctx, time.Minute, 1000, nil)

	txn, err := store.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer txn.Rollback(ctx) // a no-op after Commit
	res, err := txn.Claim(ctx, "billing", []driver.Claim{{ID: "order-42"}})
	if err != nil {
		log.Fatal(err) // mysql.IsTransient(err): deadlock, lock wait timeout, lost connection
	}
	if res[0] == driver.ClaimWon {
		if _, err := txn.Tx().ExecContext(ctx, `UPDATE balances SET amount = amount + 10 WHERE account = 'alice'`); err != nil {
			log.Fatal(err)
		}
	}
	if err := txn.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0])
}
