package redis

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// links holds the open links (as keys), for go-redis's lines that do not
// say whose command they are about.
var links sync.Map

// linkKey marks the context of a link's commands with the link.
type linkKey struct{}

// clientLog is the go-redis hook that ties go-redis's own lines to their
// link (clientLogger): it marks the context of each of the link's commands
// with the link, and keeps the error of its last failed dial, which the
// pool reports from a goroutine of its own after its retries.
type clientLog struct{ l *link }

func (h clientLog) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		var text *string
		if err != nil {
			text = new(err.Error())
		}
		h.l.dialErr.Store(text)
		return conn, err
	}
}

func (h clientLog) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return next(context.WithValue(ctx, linkKey{}, h.l), cmd)
	}
}

func (h clientLog) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		return next(context.WithValue(ctx, linkKey{}, h.l), cmds)
	}
}

// clientLogger is go-redis's process-wide logger: each line becomes a
// warning of the logger of the link it is about (the one whose command's
// context it got, else each whose last failed dial it reports), one record
// per logger with the links' streams, or of slog.Default() when it is
// about no link.
type clientLogger struct{}

func (clientLogger) Printf(ctx context.Context, format string, v ...any) {
	const msg = "idemq redis: go-redis log"
	line := strings.TrimSpace(fmt.Sprintf(format, v...))
	streams := map[*slog.Logger][]string{}
	about := func(l *link) { lg := l.logger(); streams[lg] = append(streams[lg], l.stream) }
	if l, ok := ctxValue(ctx); ok {
		about(l)
	} else {
		links.Range(func(k, _ any) bool {
			if e := k.(*link).dialErr.Load(); e != nil && strings.Contains(line, *e) {
				about(k.(*link))
			}
			return true
		})
	}
	if len(streams) == 0 {
		slog.Default().Warn(msg, "line", line)
	}
	for lg, s := range streams {
		slices.Sort(s)
		lg.Warn(msg, "line", line, "stream", strings.Join(slices.Compact(s), ","))
	}
}

// ctxValue returns the link whose command ctx is of.
func ctxValue(ctx context.Context) (*link, bool) {
	if ctx == nil {
		return nil, false
	}
	l, ok := ctx.Value(linkKey{}).(*link)
	return l, ok
}
