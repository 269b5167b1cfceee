package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/internal/redact"
)

// link is a connection and its JetStream context.
type link struct {
	nc  *natsgo.Conn
	js  jetstream.JetStream
	own bool // dialled here: closed by close
}

// dial connects as c says (or uses WithConn's connection). log, if not
// nil, gets the connection's disconnects and reconnects.
func dial(c *config, log func() *slog.Logger) (*link, error) {
	l := &link{nc: c.conn}
	if l.nc == nil {
		opts := []natsgo.Option{
			natsgo.Name("idemq"),
			natsgo.MaxReconnects(-1),
			natsgo.ReconnectWait(250 * time.Millisecond),
		}
		if log != nil {
			opts = append(opts,
				natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
					if err != nil {
						log().Warn("idemq nats: disconnected; reconnecting", "error", err)
					}
				}),
				natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
					log().Info("idemq nats: reconnected", "server", redact.URL(nc.ConnectedUrlRedacted()))
				}))
		}
		opts = append(opts, c.natsOpts...)
		nc, err := natsgo.Connect(strings.Join(c.servers, ","), opts...)
		if err != nil {
			shown := make([]string, len(c.servers))
			for i, s := range c.servers {
				shown[i] = redact.URL(s)
			}
			return nil, fmt.Errorf("nats: connecting to %s: %w", strings.Join(shown, ","), err)
		}
		l.nc, l.own = nc, true
	}
	js, err := jetstream.New(l.nc)
	if err != nil {
		l.close()
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	l.js = js
	return l, nil
}

// connect resolves opts for stream, dials, and finds the stream the
// caller works on with find; after an error nothing stays open.
func connect(ctx context.Context, stream string, needConsumer bool, opts []Option, find func(c *config, l *link) (jetstream.Stream, error)) (config, *link, jetstream.Stream, error) {
	c, err := resolve(stream, needConsumer, opts)
	if err != nil {
		return c, nil, nil, err
	}
	l, err := dial(&c, nil)
	if err != nil {
		return c, nil, nil, err
	}
	st, err := find(&c, l)
	if err != nil {
		l.close()
		return c, nil, nil, err
	}
	return c, l, st, nil
}

func (l *link) close() {
	if l.own {
		l.nc.Close()
	}
}

// stream returns the stream called name, creating it on subject when it
// is missing and declare is set; what names it in errors. A dead-letter
// stream (shared is set) that exists gains subject when declare is set,
// as each consumer that shares it parks on a subject of its own.
func (l *link) stream(ctx context.Context, name, subject, what string, declare, shared bool) (jetstream.Stream, error) {
	st, err := l.js.Stream(ctx, name)
	switch {
	case err == nil:
		if !declare || !shared || slices.Contains(st.CachedInfo().Config.Subjects, subject) {
			return st, nil
		}
		cfg := st.CachedInfo().Config
		cfg.Subjects = append(cfg.Subjects, subject)
		if st, err = l.js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("nats: adding subject %s to the %s %s: %w", subject, what, name, err)
		}
		return st, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("nats: looking up the %s %s: %w", what, name, err)
	case !declare:
		return nil, fmt.Errorf("nats: the %s %s does not exist (declare it, or let the adapter with declare=true)", what, name)
	}
	st, err = l.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{subject},
		Storage:  jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: creating the %s %s on %s: %w", what, name, subject, err)
	}
	return st, nil
}
