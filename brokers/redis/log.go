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

// links are the links open in the process, for the go-redis log lines
// that do not say whose command they are about.
var links = struct {
	sync.Mutex
	m map[*link]bool
}{m: map[*link]bool{}}

// linkKey marks the context of a link's commands with the link.
type linkKey struct{}

// clientLog is the go-redis hook that ties go-redis's own log lines to the
// link they are about (clientLogger): it marks the context of each command
// the link sends with the link, and keeps the error of the link's last
// failed dial, which go-redis's pool reports from a goroutine of its own
// after its retries.
type clientLog struct{ l *link }

func (h clientLog) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			text := err.Error()
			h.l.dialErr.Store(&text)
		} else {
			h.l.dialErr.Store(nil)
		}
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

// ctxLink returns the link whose command ctx is of.
func ctxLink(ctx context.Context) (*link, bool) {
	if ctx == nil {
		return nil, false
	}
	l, ok := ctx.Value(linkKey{}).(*link)
	return l, ok
}

// clientLogger is go-redis's process-wide logger: each line becomes a
// warning of the logger of the link it is about (the one whose command's
// context it got, else each whose last failed dial it reports), one record
// per logger, or of slog.Default() when it is about no link.
type clientLogger struct{}

func (clientLogger) Printf(ctx context.Context, format string, v ...any) {
	const msg = "idemq redis: go-redis log"
	line := strings.TrimSpace(fmt.Sprintf(format, v...))
	var about []*link
	if l, ok := ctxLink(ctx); ok {
		about = append(about, l)
	} else {
		links.Lock()
		for l := range links.m {
			if e := l.dialErr.Load(); e != nil && strings.Contains(line, *e) {
				about = append(about, l)
			}
		}
		links.Unlock()
	}
	if len(about) == 0 {
		slog.Default().Warn(msg, "line", line)
		return
	}
	streams := map[*slog.Logger][]string{}
	for _, l := range about {
		lg := l.logger()
		streams[lg] = append(streams[lg], l.stream)
	}
	for lg, s := range streams {
		slices.Sort(s)
		lg.Warn(msg, "line", line, "stream", strings.Join(slices.Compact(s), ","))
	}
}
