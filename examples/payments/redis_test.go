package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/internal/servicetest"
)

// redisURL returns IDEMQ_REDIS_URL (default the local server), without a
// path, once the server there answered a PING; unreachable, it skips t (or
// fails it with IDEMQ_REQUIRE_SERVICES=1) naming the variable.
func redisURL(t testing.TB) string {
	t.Helper()
	return strings.TrimRight(servicetest.URL(t, "IDEMQ_REDIS_URL", "redis://127.0.0.1:6379", func(ctx context.Context, u string) error {
		c, err := redisClient(u)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Ping(ctx).Err()
	}), "/")
}

func redisClient(u string) (*goredis.Client, error) {
	o, err := goredis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return goredis.NewClient(o), nil
}

// TestKillAndRestartRedisPostgres kills the service three times while it
// consumes a Redis stream in a consumer group. Each restart, under the
// same consumer name (the host name), reads back the entries the killed
// run held, then resumes from the group's state on the server.
//
// Redis keeps every XADD: each duplicate copy is an entry of its own with
// the original's id in idemq-id, decided Duplicate before it is acked.
func TestKillAndRestartRedisPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	messages, kills := killMessages(t), 3
	res := runKillAndRestart(t, onRedis(t, killRun{
		store: store, tables: prefix, ledger: l, messages: messages, duplicates: 0.2, kills: kills, batch: 20, concurrency: 2,
	}))
	checkCopiesDecided(t, res, messages, kills)
}

// onRedis points r at a fresh stream read by the group payments (pending
// entries reclaimed after 5s idle), drained and settled once the group
// read r.messages and holds none pending (redisDrained, redisSettled).
func onRedis(t *testing.T, r killRun) killRun {
	base := redisURL(t)
	rdb, err := redisClient(base)
	if err != nil {
		t.Fatal(err)
	}
	stream := "payments-" + randomHex(4)
	t.Cleanup(func() {
		rdb.Del(context.Background(), stream, stream+":dlq")
		rdb.Close()
	})
	r.broker = base + "/" + stream + "?group=payments&min_idle=5s"
	r.drained = func() bool { return redisDrained(rdb, stream) == nil }
	r.settled = func(t *testing.T) { redisSettled(t, rdb, stream, r.messages) }
	return r
}

// redisGroup returns the state of stream's group "payments".
func redisGroup(ctx context.Context, rdb *goredis.Client, stream string) (goredis.XInfoGroup, error) {
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return goredis.XInfoGroup{}, err
	}
	for _, g := range groups {
		if g.Name == "payments" {
			return g, nil
		}
	}
	return goredis.XInfoGroup{}, fmt.Errorf("stream %s has no group payments", stream)
}

// redisDrained is nil once the group payments has read every entry of
// stream (lag 0) and none is pending (XPENDING).
func redisDrained(rdb *goredis.Client, stream string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := redisGroup(ctx, rdb, stream)
	if err != nil {
		return err
	}
	p, err := rdb.XPending(ctx, stream, "payments").Result()
	if err != nil {
		return err
	}
	if g.Lag != 0 || p.Count != 0 {
		return fmt.Errorf("group payments: lag %d, %d pending", g.Lag, p.Count)
	}
	return nil
}

// redisSettled checks that stream holds all the messages published to it,
// copies included, that the group payments read every one (entries-read,
// lag 0) and has none pending, and that nothing was dead-lettered.
func redisSettled(t *testing.T, rdb *goredis.Client, stream string, messages int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := rdb.XLen(ctx, stream).Result(); err != nil || n != int64(messages) {
		t.Errorf("stream %s holds %d entries (%v), want %d (originals and copies)", stream, n, err, messages)
	}
	g, err := redisGroup(ctx, rdb, stream)
	if err != nil {
		t.Fatal(err)
	}
	if g.EntriesRead != int64(messages) || g.Lag != 0 || g.Pending != 0 {
		t.Errorf("group payments: %d entries read of %d, lag %d, %d pending after the graceful stop", g.EntriesRead, messages, g.Lag, g.Pending)
	}
	p, err := rdb.XPending(ctx, stream, "payments").Result()
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != 0 {
		t.Errorf("XPENDING: %d entries pending after the graceful stop (%s to %s, by %v)", p.Count, p.Lower, p.Higher, p.Consumers)
	}
	if n, err := rdb.XLen(ctx, stream+":dlq").Result(); err != nil || n != 0 {
		t.Errorf("dead-letter stream %s:dlq holds %d entries (%v), want none", stream, n, err)
	}
}
