package admin

import (
	"context"
	"net/url"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/registry"
)

// Horizon is a store's retention held against a broker's redelivery
// horizon: a claim pruned while the broker can still redeliver its message
// lets that message be applied twice.
type Horizon struct {
	// Broker is the broker URL checked, without credentials.
	Broker string
	// Retention is how long the store keeps claims; RetentionKnown is
	// false when the store does not tell.
	Retention      time.Duration
	RetentionKnown bool
	// Horizon is the longest time after which the broker can still
	// redeliver a message, driver.Unbounded when it keeps messages until
	// they are consumed; HorizonKnown is false when the adapter cannot
	// tell.
	Horizon      time.Duration
	HorizonKnown bool
}

// Unbounded reports whether the broker is known to set no age limit on
// the messages it keeps.
func (h Horizon) Unbounded() bool { return h.HorizonKnown && h.Horizon == driver.Unbounded }

// Short reports whether both are known and claims are pruned while the
// broker can still redeliver their messages.
func (h Horizon) Short() bool {
	return h.RetentionKnown && h.HorizonKnown && h.Retention > 0 && h.Retention < h.Horizon
}

// CheckHorizon opens the broker at sourceURL as a consumer would (the URL
// core.OpenSource takes), reads its redelivery horizon
// (driver.RedeliveryHorizoner) and holds it against s's retention.
func CheckHorizon(ctx context.Context, s *Store, sourceURL string) (Horizon, error) {
	src, _, err := registry.Open(registry.Sources, sourceURL, "broker", func(o any, u *url.URL) (driver.Source, error) {
		return o.(driver.SourceOpener)(ctx, u, driver.OpenConfig{})
	})
	if err != nil {
		return Horizon{}, err
	}
	defer src.Close()
	h := Horizon{Broker: redact.URL(sourceURL)}
	h.Retention, h.RetentionKnown = s.Retention()
	if hz, ok := src.(driver.RedeliveryHorizoner); ok {
		h.Horizon, h.HorizonKnown = hz.RedeliveryHorizon(ctx)
	}
	return h, nil
}
