package driver

import (
	"context"
	"log/slog"
	"net/url"

	"github.com/idemq/idemq/internal/registry"
)

// OpenConfig is what a service gives an opener beside the URL.
type OpenConfig struct {
	// Logger is the logger the opened source or publisher logs to. Nil
	// leaves the adapter's default: a source then logs to the logger the
	// Consumer gives it (Setup.Logger), or to slog.Default() until then.
	Logger *slog.Logger
}

// LoggerOption returns an opener's adapter option for cfg's logger,
// with(cfg.Logger), or the zero O (a nil option, which the adapters skip)
// when cfg has none.
func LoggerOption[O any](cfg OpenConfig, with func(*slog.Logger) O) O {
	if cfg.Logger == nil {
		var none O
		return none
	}
	return with(cfg.Logger)
}

// SourceOpener opens a Source (a Puller or a Pusher) from a URL of a
// scheme it was registered for.
type SourceOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (Source, error)

// PublisherOpener opens a Publisher from a URL of a scheme it was
// registered for.
type PublisherOpener func(ctx context.Context, u *url.URL, cfg OpenConfig) (Publisher, error)

// StoreOpener opens a store from a URL of a scheme it was registered for.
// It returns a Store[Tx] for the store's own Tx type, as any: core.OpenStore
// checks the type a service asks for, and admin.OpenStore takes any.
type StoreOpener func(ctx context.Context, u *url.URL) (any, error)

// RegisterSource makes a broker adapter's sources available to
// core.OpenSource under a URL scheme, as database/sql drivers register
// themselves. Adapters call it from init, so importing an adapter package
// (for its side effect, if need be) is enough. It panics if the scheme is
// registered twice or open is nil.
func RegisterSource(scheme string, open SourceOpener) {
	if open == nil {
		panic("idemq: RegisterSource " + scheme + ": nil opener")
	}
	registry.Sources.Register("RegisterSource", scheme, open)
}

// RegisterPublisher makes a broker adapter's publishers available to
// core.OpenPublisher under a URL scheme; a source that cannot be published
// to (an HTTP endpoint) registers none. It panics if the scheme is
// registered twice or open is nil.
func RegisterPublisher(scheme string, open PublisherOpener) {
	if open == nil {
		panic("idemq: RegisterPublisher " + scheme + ": nil opener")
	}
	registry.Publishers.Register("RegisterPublisher", scheme, open)
}

// RegisterStore makes a store available to core.OpenStore and
// admin.OpenStore under a URL scheme. It panics if the scheme is registered
// twice or the opener is nil.
func RegisterStore(scheme string, open StoreOpener) {
	if open == nil {
		panic("idemq: RegisterStore " + scheme + ": nil opener")
	}
	registry.Stores.Register("RegisterStore", scheme, open)
}
