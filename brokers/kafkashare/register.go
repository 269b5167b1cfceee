package kafkashare

import (
	"context"
	"errors"
	"net/url"

	"github.com/idemq/idemq/core/driver"
)

// init registers kafka+share:// with core.OpenSource. Publishing to a
// share group's topic is publishing to the topic: use kafka://.
func init() {
	driver.RegisterBroker(Scheme, func(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
		var opts []Option
		if cfg.Logger != nil {
			opts = append(opts, WithLogger(cfg.Logger))
		}
		return Open(ctx, u.String(), opts...)
	}, func(context.Context, *url.URL, driver.OpenConfig) (driver.Publisher, error) {
		return nil, errors.New("kafka+share URL: a share group only consumes; publish to the topic with a kafka:// URL")
	})
}
