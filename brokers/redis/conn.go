package redis

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/core/driver"
)

// bookkeeping are the fields a dead letter carries beside the message's
// own; Redrive, the Publisher and DeadLetter never copy them from headers.
var bookkeeping = []string{driver.CauseHeader, driver.AttemptHeader, driver.OriginHeader, driver.ParkedAtHeader, driver.DestinationHeader}

// link is a client and whether it was dialled here.
type link struct {
	c   config
	rdb goredis.UniversalClient
	own bool
}

// connect resolves opts for stream and dials addr (unless WithClient gave
// a client), checking the server answers.
func connect(ctx context.Context, addr, stream string, needGroup bool, opts []Option) (*link, error) {
	c, err := resolve(stream, needGroup, opts)
	if err != nil {
		return nil, err
	}
	l := &link{c: c, rdb: c.client}
	if l.rdb == nil {
		l.rdb = goredis.NewClient(&goredis.Options{Addr: addr, Username: c.user, Password: c.pass, DB: c.db, TLSConfig: c.tls, ClientName: "idemq"})
		l.own = true
	}
	if err := l.rdb.Ping(ctx).Err(); err != nil {
		l.close()
		return nil, fmt.Errorf("redis: connecting to %s: %w", addr, err)
	}
	return l, nil
}

func (l *link) close() error {
	if !l.own {
		return nil
	}
	return l.rdb.Close()
}

// fields are an entry's fields for a message: its headers (none of the
// adapter's own field names), then id, key and body.
func (l *link) fields(h map[string]string, id, key string, body []byte) []any {
	var out []any
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if k != BodyField && k != KeyField && k != l.c.idField && !slices.Contains(bookkeeping, k) {
			out = append(out, k, h[k])
		}
	}
	if id != "" {
		out = append(out, l.c.idField, id)
	}
	if key != "" {
		out = append(out, KeyField, key)
	}
	return append(out, BodyField, body)
}

// xadd adds values to stream, trimming it as WithMaxLen or WithMaxAge say.
func (l *link) xadd(ctx context.Context, p goredis.Pipeliner, stream string, values []any) *goredis.StringCmd {
	a := &goredis.XAddArgs{Stream: stream, Values: values, Approx: true, MaxLen: l.c.maxLen}
	if l.c.maxAge > 0 {
		a.MinID = strconv.FormatInt(time.Now().Add(-l.c.maxAge).UnixMilli(), 10)
	}
	if p != nil {
		return p.XAdd(ctx, a)
	}
	return l.rdb.XAdd(ctx, a)
}

// message reads an entry's fields: idField is the id, the adapter's other
// fields the key and body, the rest headers.
func message(idField string, values map[string]any) (m driver.Message, hasID bool) {
	h := make(map[string]string, len(values))
	for k, v := range values {
		h[k], _ = v.(string)
	}
	m.ID, hasID = h[idField]
	m.Key, m.Body = h[KeyField], []byte(h[BodyField])
	delete(h, idField)
	delete(h, KeyField)
	delete(h, BodyField)
	m.Headers = h
	return m, hasID
}

// entryTime is when an entry id says the entry was added.
func entryTime(id string) time.Time {
	ms, _ := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
	return time.UnixMilli(ms)
}
