package nats

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver/unsettled"
	"github.com/idemq/idemq/internal/redact"
)

// link is a connection and its JetStream context.
type link struct {
	nc       *natsgo.Conn
	js       jetstream.JetStream
	own      bool // dialled here: closed by close
	replicas int  // of the streams stream creates
}

// connect reads addr and opts and dials the servers (or takes WithConn's
// connection). logs, if not nil, is given the configured logger and gets
// the connection's disconnects and reconnects.
func connect[O Option](addr string, needConsumer bool, opts []O, logs *unsettled.Logger) (config, *link, error) {
	c, err := resolve(addr, needConsumer, opts)
	if err != nil {
		return c, nil, err
	}
	l := &link{nc: c.conn, replicas: c.replicas}
	dialOpts := []natsgo.Option{natsgo.Name("idemq"), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(250 * time.Millisecond)}
	if logs != nil {
		logs.Init(c.logger)
		dialOpts = append(dialOpts,
			natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
				if err != nil {
					logs.Log().Warn("idemq nats: disconnected; reconnecting", "error", err)
				}
			}),
			natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
				logs.Log().Info("idemq nats: reconnected", "server", redact.URL(nc.ConnectedUrlRedacted()))
			}))
	}
	if l.nc == nil {
		nc, err := natsgo.Connect(strings.Join(c.servers, ","), append(dialOpts, c.natsOpts...)...)
		if err != nil {
			return c, nil, fmt.Errorf("nats: connecting to %s: %w", strings.Join(c.servers, ","), err) // hosts only: no secret
		}
		l.nc, l.own = nc, true
	}
	if l.js, err = jetstream.New(l.nc); err != nil {
		l.close()
		return c, nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	return c, l, nil
}

func (l *link) close() error {
	if l.own {
		l.nc.Close()
	}
	return nil
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
	if st, err = l.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage, Replicas: l.replicas}); err != nil {
		return nil, fmt.Errorf("nats: creating the %s %s on %s: %w", what, name, subject, err)
	}
	return st, nil
}
