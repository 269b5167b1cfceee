package benchmark

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	_ "github.com/idemq/idemq/brokers/nats" // the nats:// scheme of core.OpenSource
)

// natsIDHeader carries the business id of a copy that must reach the
// consumers: JetStream drops a publish whose Nats-Msg-Id it saw within the
// stream's duplicate window (2 minutes by default), so the workload's
// duplicate copies (of one of the last 1,000 ids, as a redelivery would be)
// carry a Nats-Msg-Id of their own and the business id here. It is the
// header idemq's adapter gives precedence to (nats.IDHeader); the raw
// consumers read it the same way (natsMsg).
const natsIDHeader = "idemq-id"

// natsBroker is the NATS JetStream side of a run: the server URL and
// options for raw nats.go, and the user's idemq URL to reopen with another
// stream and consumer. Every run creates its own stream (file storage, its
// own name as its only subject, as idemq's adapter declares it) and
// deletes it and the adapter's dead-letter stream (STREAM_DLQ) afterwards.
type natsBroker struct {
	idemqURL *url.URL // Config.Broker
	servers  string   // nats://[user:pass@]host:port[,…] for nats.Connect
	opts     []natsgo.Option
	base     string

	once sync.Once
	nc   *natsgo.Conn // for setup, publishing and removal
	js   jetstream.JetStream
	err  error
}

// natsRunParams are the adapter's parameters the benchmark sets per run:
// a URL that gives them would name streams or consumers shared by runs.
var natsRunParams = []string{"consumer", "subject", "dlq_stream", "dlq_subject", "declare"}

func newNATS(u *url.URL) (*natsBroker, error) {
	n := &natsBroker{idemqURL: u, base: strings.Trim(u.Path, "/")}
	if n.base == "" {
		n.base = "idemq-bench"
	}
	if strings.ContainsAny(n.base, "/.*> ") {
		return nil, fmt.Errorf("benchmark: Config.Broker: %q is not a stream name (no '/', '.', '*', '>' or spaces)", n.base)
	}
	q := u.Query()
	for _, p := range natsRunParams {
		if q.Has(p) {
			return nil, fmt.Errorf("benchmark: Config.Broker: the nats:// parameter %s is set per run by the benchmark; leave it out", p)
		}
	}
	if q.Has("id_header") {
		return nil, errors.New("benchmark: Config.Broker: the raw consumers read Nats-Msg-Id; leave id_header out")
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		s := url.URL{Scheme: "nats", Host: strings.TrimSpace(h), User: u.User}
		hosts[i] = s.String()
	}
	n.servers = strings.Join(hosts, ",")
	n.opts = []natsgo.Option{natsgo.Name("idemq-bench"), natsgo.Timeout(10 * time.Second)}
	// The connection parameters of idemq's nats:// URLs, for the raw
	// consumers' own connections.
	if v := q.Get("token"); v != "" {
		n.opts = append(n.opts, natsgo.Token(v))
	}
	if b, _ := strconv.ParseBool(q.Get("tls")); b {
		n.opts = append(n.opts, natsgo.Secure())
	}
	if v := q.Get("tls_ca"); v != "" {
		n.opts = append(n.opts, natsgo.RootCAs(v))
	}
	if c, k := q.Get("tls_cert"), q.Get("tls_key"); c != "" || k != "" {
		n.opts = append(n.opts, natsgo.ClientCert(c, k))
	}
	if v := q.Get("creds"); v != "" {
		n.opts = append(n.opts, natsgo.UserCredentials(v))
	}
	if v := q.Get("nkey_seed"); v != "" {
		o, err := natsgo.NkeyOptionFromSeed(v)
		if err != nil {
			return nil, errors.New("benchmark: Config.Broker: cannot read the nkey seed file")
		}
		n.opts = append(n.opts, o)
	}
	return n, nil
}

// connect opens a connection of the raw nats.go consumers' own.
func (n *natsBroker) connect() (*natsgo.Conn, jetstream.JetStream, error) {
	nc, err := natsgo.Connect(n.servers, n.opts...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// shared is the connection for setup, publishing and removal, opened on
// first use.
func (n *natsBroker) shared() (*natsgo.Conn, jetstream.JetStream, error) {
	n.once.Do(func() { n.nc, n.js, n.err = n.connect() })
	return n.nc, n.js, n.err
}

func (n *natsBroker) kind() string      { return "NATS JetStream" }
func (n *natsBroker) baseQueue() string { return n.base }

func (n *natsBroker) close() {
	if n.nc != nil {
		n.nc.Close()
	}
}

func (n *natsBroker) ping(ctx context.Context) error {
	_, js, err := n.shared()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func (n *natsBroker) version(context.Context) string {
	nc, _, err := n.shared()
	if err != nil {
		return "NATS (version unknown)"
	}
	return "nats-server " + nc.ConnectedServerVersion() + " with JetStream, file storage (nats.go client)"
}

func (n *natsBroker) describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw nats.go): pull consumer, max 5 pending, 1 tx per message then AckSync; 1 worker"
	case SeedP100W8:
		return "seed pattern (raw nats.go): pull consumer, max 100 pending, 1 tx per message then AckSync; 8 workers"
	case HandBatch:
		return "hand-tuned batch (raw drivers): 1 claim + 1 set-based UPDATE + 1 commit + the batch's acks and 1 flush"
	case RawAck:
		return "broker only: pull + the batch's acks and 1 flush, no database"
	}
	return ""
}

// sourceURL is Config.Broker with its stream replaced by queue, queue as
// the subject and group as the consumer.
func (n *natsBroker) sourceURL(queue, group string) string {
	u := *n.idemqURL
	u.Path = "/" + queue
	q := u.Query()
	q.Set("consumer", group)
	q.Set("subject", queue)
	u.RawQuery = q.Encode()
	return u.String()
}

// declare creates the run's stream as idemq's adapter would (file storage,
// on the subject of its name, no limits), so every configuration reads the
// same kind of stream. The adapter adds its dead-letter stream when the
// idemq configurations open it.
func (n *natsBroker) declare(ctx context.Context, queue string) error {
	_, js, err := n.shared()
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     queue,
		Subjects: []string{queue},
		Storage:  jetstream.FileStorage,
	})
	return err
}

// remove deletes the run's stream (and its consumers) and the adapter's
// dead-letter stream, if the run made one.
func (n *natsBroker) remove(queue string) error {
	_, js, err := n.shared()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = js.DeleteStream(ctx, queue)
	if derr := js.DeleteStream(ctx, queue+"_DLQ"); derr != nil && !errors.Is(derr, jetstream.ErrStreamNotFound) && err == nil {
		err = derr
	}
	return err
}

// natsPublication is one message to publish: the business id, the
// Nats-Msg-Id (the business id, or one of the copy's own) and the body.
func natsPublication(subject, id, msgID string, body []byte) *natsgo.Msg {
	h := natsgo.Header{}
	h.Set(natsgo.MsgIdHdr, msgID)
	if msgID != id {
		h.Set(natsIDHeader, id)
	}
	h.Set(headerTS, strconv.FormatInt(time.Now().UnixNano(), 10))
	return &natsgo.Msg{Subject: subject, Header: h, Data: body}
}

// publishAsync publishes msgs (made by next, count of them) with async
// publishes, up to 1,000 outstanding, and returns once JetStream acked
// every one.
func (n *natsBroker) publishAsync(ctx context.Context, count int, next func(i int) *natsgo.Msg) error {
	_, js, err := n.shared()
	if err != nil {
		return err
	}
	const chunk = 1000
	futures := make([]jetstream.PubAckFuture, 0, chunk)
	for start := 0; start < count; start += chunk {
		futures = futures[:0]
		for i := start; i < min(start+chunk, count); i++ {
			f, err := js.PublishMsgAsync(next(i))
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					return fmt.Errorf("publish: JetStream dropped %s as a duplicate", f.Msg().Header.Get(natsgo.MsgIdHdr))
				}
			case err := <-f.Err():
				return fmt.Errorf("publish: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// publishBacklog publishes the backlog with async publishes and waits for
// every ack. The first copy of an id has the business id as its
// Nats-Msg-Id; a duplicate copy has its own (id/dup-POSITION) and the
// business id in idemq-id, or JetStream would drop it.
func (n *natsBroker) publishBacklog(ctx context.Context, queue string, w *workload) error {
	seen := make([]bool, w.n)
	return n.publishAsync(ctx, len(w.seq), func(i int) *natsgo.Msg {
		num := int(w.seq[i])
		id, msgID := backlogID(num), backlogID(num)
		if seen[num] {
			msgID = id + "/dup-" + strconv.Itoa(i)
		}
		seen[num] = true
		return natsPublication(queue, id, msgID, w.body(num))
	})
}

// publishPaced publishes paced messages, each waiting for its ack.
func (n *natsBroker) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	_, js, err := n.shared()
	if err != nil {
		return 0, err
	}
	return pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		_, err := js.PublishMsg(ctx, natsPublication(queue, id, id, w.body(num)))
		return err
	})
}

// natsMsg is a delivery as the raw consumers see it: the business id is
// idemq-id when present (a duplicate copy), else Nats-Msg-Id.
func natsMsg(m jetstream.Msg) msg {
	h := m.Headers()
	out := msg{id: h.Get(natsIDHeader), body: m.Data()}
	if out.id == "" {
		out.id = h.Get(natsgo.MsgIdHdr)
	}
	out.ts, _ = strconv.ParseInt(h.Get(headerTS), 10, 64)
	return out
}

// pull opens a connection of its own and a durable pull consumer on the
// run's stream with explicit acks and at most pending unacknowledged
// messages (as a RabbitMQ prefetch), and pumps its messages, pulled
// pending at a time, into a channel buffered to pending. The returned
// stop ends the pull and closes the connection.
func (n *natsBroker) pull(ctx context.Context, e *runEnv, pending, workers int) (<-chan jetstream.Msg, *natsgo.Conn, func(), error) {
	nc, js, err := n.connect()
	if err != nil {
		return nil, nil, nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, e.queue, jetstream.ConsumerConfig{
		Durable:       e.consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: pending * workers,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(pending))
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	out := make(chan jetstream.Msg, pending)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for {
			m, err := it.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
				continue // a missed heartbeat: the pull goes on
			}
			out <- m
		}
	}()
	stop := func() {
		it.Stop()
		for range out { // unblock the pump; the rest is redelivered
		}
		<-done
		nc.Close()
	}
	return out, nc, stop, nil
}

// seed is the seed-style consumer on nats.go: workers goroutines share one
// durable pull consumer with at most prefetch messages unacknowledged
// (MaxAckPending, and pulls of prefetch), and for each message run one
// store transaction, then acknowledge it with AckSync, the double ack that
// waits for JetStream's confirmation, as idemq's adapter acks a single
// message: a plain Ack (what most users write) can be lost with the
// connection unnoticed. A failed transaction is Nak'ed for redelivery.
func (n *natsBroker) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, nw int) (*counts, error) {
	ms, _, stop, err := n.pull(ctx, e, prefetch, 1)
	if err != nil {
		return nil, err
	}
	defer stop()
	var c counts
	err = workers(ctx, nw, func() error {
		for {
			var d jetstream.Msg
			select {
			case d = <-ms:
			case <-ctx.Done():
				return nil
			}
			if d == nil {
				return errors.New("delivery channel closed")
			}
			m := natsMsg(d)
			dup, err := e.store.seedTx(ctx, e, &m)
			if err != nil {
				if ctx.Err() != nil {
					return nil // shutting down: left unacked for redelivery
				}
				c.retried.Add(1)
				d.Nak()
				continue
			}
			if dup {
				c.duplicates.Add(1)
			} else {
				c.processed.Add(1)
			}
			t.decided(m.id, m.ts) // at the commit, before the ack
			t.batches.Add(1)
			if err := d.DoubleAck(ctx); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		}
	})
	return &c, err
}

// natsBatches runs workers loops, each with its own connection and pull
// on one durable consumer (4 × size pulled and pending per worker, as the
// RabbitMQ prefetch and idemq's default window), taking batches of up to
// size messages and handing them to do, then sending the batch's acks and
// one flush: its answer confirms the server read them all, one round trip
// per batch, as idemq's adapter acknowledges a batch (JetStream has no
// multiple ack for explicit-ack consumers; AckAll would also take
// unsettled messages before the batch). A failed do Naks the batch.
func (n *natsBroker) natsBatches(ctx context.Context, e *runEnv, t *tracker, size, nw int, do func([]msg) (int, error)) (*counts, error) {
	var c counts
	type puller struct {
		ms <-chan jetstream.Msg
		nc *natsgo.Conn
	}
	ps := make([]puller, nw)
	for i := range ps {
		ms, nc, stop, err := n.pull(ctx, e, 4*size, nw)
		if err != nil {
			return nil, err
		}
		defer stop()
		ps[i] = puller{ms, nc}
	}
	next := make(chan puller, nw)
	for _, p := range ps {
		next <- p
	}
	err := workers(ctx, nw, func() error {
		p := <-next
		buf := make([]jetstream.Msg, 0, size)
		ms := make([]msg, 0, size)
		for {
			b, err := nextMsgs(ctx, p.ms, buf, size)
			if err != nil {
				return err
			}
			ms = ms[:0]
			for _, d := range b {
				ms = append(ms, natsMsg(d))
			}
			won, err := do(ms)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				c.retried.Add(int64(len(b)))
				for _, d := range b {
					d.Nak()
				}
				continue
			}
			c.processed.Add(int64(won))
			c.duplicates.Add(int64(len(b) - won))
			for i := range ms {
				t.decided(ms[i].id, ms[i].ts)
			}
			t.batches.Add(1)
			for _, d := range b {
				if err := d.Ack(); err != nil {
					return fmt.Errorf("ack: %w", err)
				}
			}
			if err := p.nc.FlushTimeout(10 * time.Second); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("flush after the acks: %w", err)
			}
		}
	})
	return &c, err
}

// handBatch is the hand-tuned batch consumer on nats.go: batches of up to
// size, one store transaction (batchTx), the batch's acks and one flush.
func (n *natsBroker) handBatch(ctx context.Context, e *runEnv, t *tracker, size, nw int) (*counts, error) {
	return n.natsBatches(ctx, e, t, size, nw, func(b []msg) (int, error) { return e.store.batchTx(ctx, e, b) })
}

// rawAck pulls and acknowledges in batches of size, no database.
func (n *natsBroker) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	return n.natsBatches(ctx, e, t, size, 1, func(b []msg) (int, error) { return len(b), nil })
}
