package effects_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
)

// The same inputs always give the same key; without the secret nobody can
// compute it.
func ExampleIdempotencyKey() {
	secret := []byte("0123456789abcdef0123456789abcdef") // load yours from a secret store
	k1, _ := effects.IdempotencyKey(secret, "billing", "order-42", "charge")
	k2, _ := effects.IdempotencyKey(secret, "billing", "order-42", "charge")
	k3, _ := effects.IdempotencyKey(secret, "billing", "order-42", "receipt-email")
	fmt.Println(k1)
	fmt.Println(k1 == k2, k1 == k3)
	// Output:
	// KSMkemfZo8E3nsRVszFG7xECsVTDe9G-8NXOTBSHph8
	// true false
}

// A handler charges a card once per message: the charge is remembered on
// the pool (so it survives the handler's transaction rolling back), and the
// HTTP call carries the idempotency key of (consumer, message, "charge").
func ExampleTable_Remember() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	keyer, err := effects.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		log.Fatal(err)
	}
	charges, err := effects.NewTable(effects.Postgres, effects.WithKeyer(keyer))
	if err != nil {
		log.Fatal(err)
	}
	if err := charges.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: &effects.Transport{}}

	handler := func(ctx context.Context, tx pgx.Tx, m *core.Message) error {
		id, err := charges.Remember(ctx, pool, core.ConsumerName(ctx), m.ID, "charge", func(ctx context.Context) ([]byte, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://payments.example/charges", nil)
			resp, err := client.Do(req) // sends Idempotency-Key
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			return io.ReadAll(resp.Body)
		})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE orders SET charge = $1 WHERE id = $2`, string(id), m.ID)
		return err
	}
	_ = handler // core.New[pgx.Tx](source, store, handler, core.WithName("billing"))
}
