package outbox_test

import (
	_ "github.com/idemq/idemq/brokers/memory" // registers mem://
	"github.com/idemq/idemq/core/driver"

	"context"
	"log"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/outbox"
)

// Destinations sends each destination's rows through a publisher opened by
// URL, so configuration picks the broker per destination.
func ExampleDestinations() {
	ctx := context.Background()
	orders, err := core.OpenPublisher(ctx, "mem://orders")
	if err != nil {
		log.Fatal(err)
	}
	emails, err := core.OpenPublisher(ctx, "mem://emails")
	if err != nil {
		log.Fatal(err)
	}
	pub := outbox.Destinations(map[string]driver.Publisher{"orders": orders.Driver(), "emails": emails.Driver()})
	_ = pub // pass to pgoutbox.Outbox.NewRelay or mysqloutbox.Outbox.NewRelay
}
