package benchmark

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	idemqredis "github.com/idemq/idemq/brokers/redis" // and the redis:// scheme of core.OpenSource
)

// redisBlock is how long the raw consumers' XREADGROUP blocks for new
// entries (the adapter's default poll): it bounds how long a consumer
// takes to stop, not how soon it sees an entry.
const redisBlock = 500 * time.Millisecond

// redisBroker is the Redis Streams side of a run: go-redis options for the
// raw consumers, and the user's idemq URL to reopen with another stream
// and group. Each run's stream is made by its first XADD; every consumer
// reads it in a consumer group of its own created from the stream's start
// (the adapter's default, start=0), and the run deletes the stream with
// its groups and the adapter's dead-letter stream (STREAM:dlq)
// afterwards. An entry holds a message as idemq's adapter lays it out: the
// business id in idemq-id, the body in body, the publish time in a field
// of its own (a header to the adapter).
type redisBroker struct {
	idemqURL *url.URL // Config.Broker
	opts     *goredis.Options
	base     string

	once sync.Once
	rdb  *goredis.Client // for setup, publishing and removal
}

// redisRunParams are the adapter's parameters the benchmark sets per run
// or reads itself: a URL that gives them would share a group between
// runs, skip part of the stream, or hide the id from the raw consumers.
var redisRunParams = []string{"group", "start", "dlq", "id_field", "id_header"}

func newRedis(u *url.URL) (*redisBroker, error) {
	r := &redisBroker{idemqURL: u, base: strings.Trim(u.Path, "/")}
	if r.base == "" {
		r.base = "idemq-bench"
	}
	if u.Host == "" {
		return nil, errors.New("benchmark: Config.Broker: no host in the redis:// URL (redis://host:6379/STREAM)")
	}
	q := u.Query()
	for _, p := range redisRunParams {
		if q.Has(p) {
			return nil, fmt.Errorf("benchmark: Config.Broker: the redis:// parameter %s is set per run by the benchmark; leave it out", p)
		}
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "6379")
	}
	r.opts = &goredis.Options{Addr: addr, ClientName: "idemq-bench"}
	if u.User != nil {
		r.opts.Username = u.User.Username()
		r.opts.Password, _ = u.User.Password()
	}
	// The TLS parameters of idemq's rediss:// URLs, for the raw consumers'
	// own clients.
	if u.Scheme == "rediss" {
		tc := &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		if ca := q.Get("tls_ca"); ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, errors.New("benchmark: Config.Broker: cannot read the tls_ca file")
			}
			if tc.RootCAs = x509.NewCertPool(); !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, errors.New("benchmark: Config.Broker: no PEM certificate in the tls_ca file")
			}
		}
		if c, k := q.Get("tls_cert"), q.Get("tls_key"); c != "" || k != "" {
			pair, err := tls.LoadX509KeyPair(c, k)
			if err != nil {
				return nil, errors.New("benchmark: Config.Broker: cannot load tls_cert and tls_key")
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		r.opts.TLSConfig = tc
	}
	return r, nil
}

// client opens a client of the raw consumers' own.
func (r *redisBroker) client() *goredis.Client { return goredis.NewClient(r.opts) }

// shared is the client for setup, publishing and removal, opened on first
// use.
func (r *redisBroker) shared() *goredis.Client {
	r.once.Do(func() { r.rdb = r.client() })
	return r.rdb
}

func (r *redisBroker) kind() string      { return "Redis Streams" }
func (r *redisBroker) baseQueue() string { return r.base }

func (r *redisBroker) close() {
	if r.rdb != nil {
		r.rdb.Close()
	}
}

func (r *redisBroker) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return r.shared().Ping(ctx).Err()
}

func (r *redisBroker) version(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := r.shared().Info(ctx, "server").Result()
	if err != nil {
		return "Redis (version unknown)"
	}
	v := "unknown"
	for _, line := range strings.Split(info, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			v = s
		}
	}
	return "redis-server " + v + " (go-redis client)"
}

func (r *redisBroker) describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw go-redis): XREADGROUP, at most 5 unacked, 1 tx per message then XACK; 1 worker"
	case SeedP100W8:
		return "seed pattern (raw go-redis): XREADGROUP, at most 100 unacked, 1 tx per message then XACK; 8 workers"
	case HandBatch:
		return "hand-tuned batch (raw drivers): XREADGROUP, 1 claim + 1 set-based UPDATE + 1 commit + 1 XACK of the batch"
	case RawAck:
		return "broker only: XREADGROUP + 1 XACK of the batch, no database"
	}
	return ""
}

// sourceURL is Config.Broker with its stream replaced by queue and group
// as the consumer group.
func (r *redisBroker) sourceURL(queue, group string) string {
	u := *r.idemqURL
	u.Path = "/" + queue
	q := u.Query()
	q.Set("group", group)
	u.RawQuery = q.Encode()
	return u.String()
}

// declare has nothing to make: the first XADD makes the stream, and each
// consumer its group (the raw ones in redisConsumer, idemq's adapter when
// it opens), from the stream's start.
func (r *redisBroker) declare(context.Context, string) error { return nil }

// remove deletes the run's stream, its groups with it, and the adapter's
// dead-letter stream, if the run made one.
func (r *redisBroker) remove(queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.shared().Del(ctx, queue, queue+":dlq").Err()
}

// redisEntry is an entry's fields: the publish time, the business id and
// the body, as idemq's Publisher lays out a message (headers, id, body).
func redisEntry(id string, body []byte) []any {
	return []any{headerTS, strconv.FormatInt(time.Now().UnixNano(), 10), idemqredis.DefaultIDField, id, idemqredis.BodyField, body}
}

// publishBacklog adds the backlog with pipelined XADDs, 1,000 to a round
// trip, and returns once Redis answered every one. Each duplicate copy is
// an entry of its own with the original's id.
func (r *redisBroker) publishBacklog(ctx context.Context, queue string, w *workload) error {
	rdb := r.shared()
	const chunk = 1000
	for start := 0; start < len(w.seq); start += chunk {
		pipe := rdb.Pipeline()
		for _, num := range w.seq[start:min(start+chunk, len(w.seq))] {
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: queue, Values: redisEntry(backlogID(int(num)), w.body(int(num)))})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}

// publishPaced adds paced messages, one XADD each.
func (r *redisBroker) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	rdb := r.shared()
	return pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		return rdb.XAdd(ctx, &goredis.XAddArgs{Stream: queue, Values: redisEntry(id, w.body(num))}).Err()
	})
}

// redisMsg is an entry as the raw consumers see it.
func redisMsg(x goredis.XMessage) msg {
	out := msg{}
	out.id, _ = x.Values[idemqredis.DefaultIDField].(string)
	body, _ := x.Values[idemqredis.BodyField].(string)
	out.body = []byte(body)
	ts, _ := x.Values[headerTS].(string)
	out.ts, _ = strconv.ParseInt(ts, 10, 64)
	return out
}

// redisReader reads the run's stream as one consumer of the group: new
// entries (XREADGROUP >, blocking up to redisBlock), at most window of
// them unacknowledged at once (as a RabbitMQ prefetch: it reads only as
// many as were acknowledged since), into a channel buffered to window.
type redisReader struct {
	rdb      *goredis.Client
	stream   string
	group    string
	consumer string
	entries  chan goredis.XMessage // closed when the reader stops
	tokens   chan struct{}         // one per entry it may read
	err      error                 // why it stopped, read after entries closed
	done     chan struct{}
}

// redisConsumers opens a client of its own, creates the group e.consumer
// on the run's stream from its start unless it exists, and starts n
// readers, consumers raw-0 … raw-n-1 of the group, each with window. The
// returned stop ends them and closes the client; the entries they held
// unacknowledged stay pending, to be reclaimed by another consumer.
func (r *redisBroker) redisConsumers(ctx context.Context, e *runEnv, n, window int) ([]*redisReader, func(), error) {
	rdb := r.client()
	err := rdb.XGroupCreateMkStream(ctx, e.queue, e.consumer, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		rdb.Close()
		return nil, nil, fmt.Errorf("creating group %s: %w", e.consumer, err)
	}
	rctx, cancel := context.WithCancel(ctx)
	rs := make([]*redisReader, n)
	for i := range rs {
		rd := &redisReader{rdb: rdb, stream: e.queue, group: e.consumer, consumer: "raw-" + strconv.Itoa(i),
			entries: make(chan goredis.XMessage, window), tokens: make(chan struct{}, window), done: make(chan struct{})}
		for range window {
			rd.tokens <- struct{}{}
		}
		go rd.run(rctx)
		rs[i] = rd
	}
	stop := func() {
		cancel()
		for _, rd := range rs {
			<-rd.done
		}
		rdb.Close()
	}
	return rs, stop, nil
}

// run reads until ctx ends or a read fails.
func (rd *redisReader) run(ctx context.Context) {
	defer close(rd.done)
	defer close(rd.entries)
	for {
		// One token, waiting for it, then every other one free.
		select {
		case <-rd.tokens:
		case <-ctx.Done():
			return
		}
		n := 1
		for more := true; more; {
			select {
			case <-rd.tokens:
				n++
			default:
				more = false
			}
		}
		res, err := rd.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
			Group: rd.group, Consumer: rd.consumer, Streams: []string{rd.stream, ">"}, Count: int64(n), Block: redisBlock}).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			if ctx.Err() == nil {
				rd.err = fmt.Errorf("XREADGROUP: %w", err)
			}
			return
		}
		got := 0
		for _, st := range res {
			for _, x := range st.Messages {
				rd.entries <- x // room: it holds a token
				got++
			}
		}
		rd.release(n - got)
	}
}

// release gives back n tokens: n entries were acknowledged (or not read).
func (rd *redisReader) release(n int) {
	for range n {
		rd.tokens <- struct{}{}
	}
}

// closed is the error of a worker that found the entries closed.
func (rd *redisReader) closed() error {
	if rd.err != nil {
		return rd.err
	}
	return errors.New("delivery channel closed")
}

// ack acknowledges entries with one XACK and gives their tokens back.
func (rd *redisReader) ack(ctx context.Context, ids ...string) error {
	if err := rd.rdb.XAck(ctx, rd.stream, rd.group, ids...).Err(); err != nil {
		return fmt.Errorf("XACK: %w", err)
	}
	rd.release(len(ids))
	return nil
}

// again runs tx until it succeeds or ctx ends (ok false), counting each
// failure as a retry of n deliveries: Redis has no negative
// acknowledgement, the entries stay pending to this consumer and are tried
// again in place.
func again[T any](ctx context.Context, c *counts, n int, tx func() (T, error)) (T, bool) {
	for {
		v, err := tx()
		if err == nil {
			return v, true
		}
		if ctx.Err() != nil {
			return v, false
		}
		c.retried.Add(int64(n))
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return v, false
		}
	}
}

// seed is the seed-style consumer on go-redis: workers goroutines share
// one consumer of the group holding at most prefetch entries
// unacknowledged (XREADGROUP COUNT of what was acknowledged since), and
// for each entry run one store transaction, then XACK it.
func (r *redisBroker) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, nw int) (*counts, error) {
	rs, stop, err := r.redisConsumers(ctx, e, 1, prefetch)
	if err != nil {
		return nil, err
	}
	defer stop()
	rd := rs[0]
	var c counts
	err = workers(ctx, nw, func() error {
		for {
			var x goredis.XMessage
			var ok bool
			select {
			case x, ok = <-rd.entries:
			case <-ctx.Done():
				return nil
			}
			if !ok {
				return rd.closed()
			}
			m := redisMsg(x)
			dup, ok := again(ctx, &c, 1, func() (bool, error) { return e.store.seedTx(ctx, e, &m) })
			if !ok {
				return nil // shutting down: left pending
			}
			if dup {
				c.duplicates.Add(1)
			} else {
				c.processed.Add(1)
			}
			t.decided(m.id, m.ts) // at the commit, before the ack
			t.batches.Add(1)
			if err := rd.ack(ctx, x.ID); err != nil {
				return err
			}
		}
	})
	return &c, err
}

// redisBatches runs workers loops, each one consumer of the group with 4
// × size entries unacknowledged at most (as the RabbitMQ prefetch and
// idemq's default window), taking batches of up to size entries, handing
// them to do, then acknowledging the batch with one XACK.
func (r *redisBroker) redisBatches(ctx context.Context, e *runEnv, t *tracker, size, nw int, do func([]msg) (int, error)) (*counts, error) {
	rs, stop, err := r.redisConsumers(ctx, e, nw, 4*size)
	if err != nil {
		return nil, err
	}
	defer stop()
	next := make(chan *redisReader, nw)
	for _, rd := range rs {
		next <- rd
	}
	var c counts
	err = workers(ctx, nw, func() error {
		rd := <-next
		buf := make([]goredis.XMessage, 0, size)
		ms := make([]msg, 0, size)
		ids := make([]string, 0, size)
		for {
			b, err := nextMsgs(ctx, rd.entries, buf, size)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return rd.closed()
			}
			ms, ids = ms[:0], ids[:0]
			for _, x := range b {
				ms = append(ms, redisMsg(x))
				ids = append(ids, x.ID)
			}
			won, ok := again(ctx, &c, len(b), func() (int, error) { return do(ms) })
			if !ok {
				return nil
			}
			c.processed.Add(int64(won))
			c.duplicates.Add(int64(len(b) - won))
			for i := range ms {
				t.decided(ms[i].id, ms[i].ts)
			}
			t.batches.Add(1)
			if err := rd.ack(ctx, ids...); err != nil {
				return err
			}
		}
	})
	return &c, err
}

// handBatch is the hand-tuned batch consumer on go-redis: batches of up to
// size, one store transaction (batchTx), one XACK.
func (r *redisBroker) handBatch(ctx context.Context, e *runEnv, t *tracker, size, nw int) (*counts, error) {
	return r.redisBatches(ctx, e, t, size, nw, func(b []msg) (int, error) { return e.store.batchTx(ctx, e, b) })
}

// rawAck reads and acknowledges in batches of size, no database.
func (r *redisBroker) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	return r.redisBatches(ctx, e, t, size, 1, func(b []msg) (int, error) { return len(b), nil })
}
