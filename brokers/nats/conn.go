package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/core/driver/urlparam"
)

// link is a connection and its JetStream context.
type link struct {
	nc       *natsgo.Conn
	js       jetstream.JetStream
	own      bool                        // dialled here: closed by close
	replicas int                         // of the streams stream creates
	log      atomic.Pointer[slog.Logger] // WithLogger's, else the Consumer's; nil: slog.Default()
}

// connect reads addr and opts and dials (or takes WithConn's connection);
// with logs set it logs disconnects and reconnects.
func connect[O Option](addr string, needConsumer, logs bool, opts []O) (config, *link, error) {
	c, err := resolve(addr, needConsumer, opts)
	if err != nil {
		return c, nil, err
	}
	l := &link{nc: c.conn, replicas: c.replicas}
	l.log.Store(c.logger)
	dialOpts := []natsgo.Option{natsgo.Name("idemq"), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(250 * time.Millisecond)}
	if logs {
		dialOpts = append(dialOpts,
			natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
				if err != nil {
					l.logger().Warn("idemq nats: disconnected; reconnecting", "error", err)
				}
			}),
			natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
				l.logger().Info("idemq nats: reconnected", "server", urlparam.Redact(nc.ConnectedUrlRedacted()))
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

func (l *link) logger() *slog.Logger {
	if lg := l.log.Load(); lg != nil {
		return lg
	}
	return slog.Default()
}

func (l *link) close() error {
	if l.own {
		l.nc.Close()
	}
	return nil
}

// shut sends what the connection buffers, then closes it as close does.
func (l *link) shut() error {
	err := l.nc.FlushTimeout(5 * time.Second)
	l.close()
	return err
}

// bounded gives ctx a deadline if it has none: nats.go's request and
// flush calls need one.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

// publishChunk is how many async publishes wait for their acks together:
// below nats.go's limit.
const publishChunk = 1000

// publish publishes msgs asynchronously and waits for JetStream's acks
// (a duplicate counts as acked): errs[i] is msgs[i]'s.
func (l *link) publish(ctx context.Context, msgs []*natsgo.Msg) (errs []error) {
	errs = make([]error, len(msgs))
	for start := 0; start < len(msgs); start += publishChunk {
		chunk := msgs[start:min(start+publishChunk, len(msgs))]
		futures := make([]jetstream.PubAckFuture, len(chunk))
		for i, m := range chunk {
			futures[i], errs[start+i] = l.js.PublishMsgAsync(m)
		}
		for i, f := range futures {
			if f == nil {
				continue
			}
			select {
			case <-f.Ok():
			case err := <-f.Err():
				errs[start+i] = err
			case <-ctx.Done():
				errs[start+i] = fmt.Errorf("waiting for the publish ack: %w", ctx.Err())
			}
		}
	}
	return errs
}

// stream returns the stream name (what, in errors), creating it on subject
// when it is missing and declare is set; then a shared (dead-letter) one
// gains subject, as each consumer parks on a subject of its own.
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

// headerMap renders NATS headers as strings, the first value of each.
func headerMap(h natsgo.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}
