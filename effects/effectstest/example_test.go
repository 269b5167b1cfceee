package effectstest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
	"github.com/idemq/idemq/effects/effectstest"
)

// A test of a handler that charges a card: the provider fails the first
// attempt, the redelivery charges, and a duplicate delivery of the message
// gets the same charge replayed. The test then checks that the account was
// charged once.
func ExampleProvider() {
	provider := effectstest.NewProvider()
	defer provider.Close()

	keyer, err := effects.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: &effects.Transport{}} // sends the key

	// The handler under test: the key is the same on every delivery of m.
	handler := func(ctx context.Context, m *core.Message) error {
		ctx = keyer.ForMessage(ctx, m, "charge")
		ch, err := effectstest.PostCharge(ctx, client, provider.URL(), map[string]any{
			"account":      "acct_1",
			"amount_cents": 500,
		})
		if err != nil {
			return err // transient errors are retried, permanent ones dead-lettered
		}
		fmt.Println("charged", ch.ID)
		return nil
	}

	ctx := core.ContextWithConsumerName(context.Background(), "billing")
	m := &core.Message{ID: "order-42"}
	provider.FailNext(1, http.StatusServiceUnavailable)
	for attempt := 1; attempt <= 3; attempt++ { // three deliveries of m
		err := handler(ctx, m)
		var se *effectstest.StatusError
		if errors.As(err, &se) {
			fmt.Println("attempt", attempt, "failed:", se.StatusCode, "permanent:", core.IsPermanent(err))
		}
	}

	fmt.Println("charges:", provider.Charges(), "replays:", provider.Replays(), "requests:", provider.Requests())
	fmt.Println("acct_1 charged:", provider.ChargesByAccount()["acct_1"])
	// Output:
	// attempt 1 failed: 503 permanent: false
	// charged ch_1
	// charged ch_1
	// charges: 1 replays: 1 requests: 3
	// acct_1 charged: 500
}
