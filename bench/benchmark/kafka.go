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

	kafkago "github.com/segmentio/kafka-go"

	_ "github.com/idemq/idemq/brokers/kafka" // the kafka:// scheme of core.OpenSource
)

// kafkaIDHeader is the header idemq's Kafka adapter reads the business id
// from by default (kafka.DefaultIDHeader).
const kafkaIDHeader = "message-id"

// kafkaBroker is the Kafka side of a run: the broker list for raw
// kafka-go, and the user's idemq URL to reopen with another topic and
// group. Every run creates its own topic of `partitions` partitions (plus
// the adapter's dead-letter topic) and deletes it afterwards. Messages are
// keyed by account, as a payments producer would key them.
type kafkaBroker struct {
	idemqURL   *url.URL // Config.Broker without the benchmark's own parameters
	brokers    []string
	base       string
	partitions int
}

func newKafka(u *url.URL) (*kafkaBroker, error) {
	k := &kafkaBroker{base: strings.Trim(u.Path, "/"), partitions: 8}
	if k.base == "" {
		k.base = "idemq-bench"
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h = strings.TrimSpace(h); h != "" {
			k.brokers = append(k.brokers, h)
		}
	}
	if len(k.brokers) == 0 {
		return nil, errors.New("benchmark: Config.Broker: no host:port in the kafka:// URL")
	}
	q := u.Query()
	if v := q.Get("partitions"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("benchmark: Config.Broker: partitions %q is not a number from 1 to 1000", v)
		}
		k.partitions = n
	}
	q.Del("partitions")
	iu := *u
	iu.RawQuery = q.Encode()
	k.idemqURL = &iu
	return k, nil
}

func (k *kafkaBroker) kind() string      { return "Kafka" }
func (k *kafkaBroker) baseQueue() string { return k.base }
func (k *kafkaBroker) close()            {}

func (k *kafkaBroker) client() *kafkago.Client {
	return &kafkago.Client{Addr: kafkago.TCP(k.brokers...), Timeout: 10 * time.Second}
}

func (k *kafkaBroker) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := k.client().Metadata(ctx, &kafkago.MetadataRequest{})
	return err
}

func (k *kafkaBroker) version(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := k.client().Metadata(ctx, &kafkago.MetadataRequest{})
	if err != nil {
		return "Kafka (version unknown)"
	}
	return fmt.Sprintf("Kafka protocol, %d broker(s), %d partitions per topic (kafka-go client)", len(md.Brokers), k.partitions)
}

func (k *kafkaBroker) describe(name string) string {
	switch name {
	case SeedP5:
		return "seed pattern (raw kafka-go): 1 tx per message, then a synchronous offset commit; 1 group member, queue capacity 5"
	case SeedP100W8:
		return "seed pattern (raw kafka-go): 1 tx per message, then a synchronous offset commit; 8 group members, queue capacity 100 each"
	case HandBatch:
		return "hand-tuned batch (raw drivers): 1 claim + 1 set-based UPDATE + 1 commit + 1 offset commit (highest per partition) per batch"
	case RawAck:
		return "broker only: fetch + 1 offset commit per batch, no database"
	}
	return ""
}

// sourceURL is Config.Broker with its topic replaced by queue and its
// group by group.
func (k *kafkaBroker) sourceURL(queue, group string) string {
	u := *k.idemqURL
	u.Path = "/" + queue
	q := u.Query()
	q.Set("group", group)
	u.RawQuery = q.Encode()
	return u.String()
}

func (k *kafkaBroker) declare(ctx context.Context, queue string) error {
	resp, err := k.client().CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: queue, NumPartitions: k.partitions, ReplicationFactor: 1},
		{Topic: queue + ".dlq", NumPartitions: 1, ReplicationFactor: 1},
	}})
	if err != nil {
		return err
	}
	for name, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			return fmt.Errorf("creating topic %s: %w", name, err)
		}
	}
	return nil
}

func (k *kafkaBroker) remove(queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := k.client().DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: []string{queue, queue + ".dlq", queue + ".retry"}})
	return err
}

func (k *kafkaBroker) writer(queue string, batch int) *kafkago.Writer {
	return &kafkago.Writer{
		Addr:         kafkago.TCP(k.brokers...),
		Topic:        queue,
		Balancer:     &kafkago.Hash{},
		BatchSize:    batch,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafkago.RequireAll,
	}
}

func (k *kafkaBroker) message(w *workload, id string, num int) kafkago.Message {
	return kafkago.Message{
		Key:   []byte(accountName(w.account(num))),
		Value: w.body(num),
		Headers: []kafkago.Header{
			{Key: kafkaIDHeader, Value: []byte(id)},
			{Key: headerTS, Value: strconv.AppendInt(nil, time.Now().UnixNano(), 10)},
		},
	}
}

func (k *kafkaBroker) publishBacklog(ctx context.Context, queue string, w *workload) error {
	wr := k.writer(queue, 1000)
	defer wr.Close()
	batch := make([]kafkago.Message, 0, 1000)
	for i, num := range w.seq {
		batch = append(batch, k.message(w, backlogID(int(num)), int(num)))
		if len(batch) == cap(batch) || i == len(w.seq)-1 {
			if err := wr.WriteMessages(ctx, batch...); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

func (k *kafkaBroker) publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error) {
	wr := k.writer(queue, 1)
	defer wr.Close()
	return pace(ctx, w, rate, count, minCount, stop, func(id string, num int) error {
		return wr.WriteMessages(ctx, k.message(w, id, num))
	})
}

// reader is a consumer group member reading queue with the given queue
// capacity, committing offsets synchronously when told to.
func (k *kafkaBroker) reader(queue, group string, capacity int) *kafkago.Reader {
	return kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:           k.brokers,
		GroupID:           group,
		Topic:             queue,
		QueueCapacity:     capacity,
		MinBytes:          1,
		MaxBytes:          4 << 20,
		MaxWait:           250 * time.Millisecond,
		StartOffset:       kafkago.FirstOffset,
		HeartbeatInterval: 250 * time.Millisecond,
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  100 * time.Millisecond,
		ReadLagInterval:   -1,
	})
}

func kafkaMsg(m *kafkago.Message) msg {
	out := msg{body: m.Value}
	for _, h := range m.Headers {
		switch h.Key {
		case kafkaIDHeader:
			out.id = string(h.Value)
		case headerTS:
			out.ts, _ = strconv.ParseInt(string(h.Value), 10, 64)
		}
	}
	return out
}

// closeReaders closes readers at once (each leaves the group).
func closeReaders(rs []*kafkago.Reader) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() { r.Close() })
	}
	wg.Wait()
}

// seed is the seed-style consumer on kafka-go: workers members of one
// group, each fetching with a queue capacity of prefetch, and for each
// message one store transaction, then a synchronous offset commit of that
// message. Kafka has no per-message nack: a failed transaction is retried
// in place.
func (k *kafkaBroker) seed(ctx context.Context, e *runEnv, t *tracker, prefetch, workers int) (*counts, error) {
	var c counts
	rs := make([]*kafkago.Reader, workers)
	for i := range rs {
		rs[i] = k.reader(e.queue, e.consumer, prefetch)
	}
	defer closeReaders(rs)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				km := kafkaMsg(&m)
				var dup bool
				for {
					if dup, err = e.store.seedTx(ctx, e, &km); err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
					c.retried.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
				if dup {
					c.duplicates.Add(1)
				} else {
					c.processed.Add(1)
				}
				t.decided(km.id, km.ts) // at the commit, before the offset commit
				t.batches.Add(1)
				if err := r.CommitMessages(ctx, m); err != nil {
					if ctx.Err() == nil {
						errc <- fmt.Errorf("offset commit: %w", err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return &c, err
	default:
	}
	return &c, nil
}

// fetchPump moves a reader's messages into a channel buffered to capacity,
// so that a batch can take at once what was already fetched.
func fetchPump(ctx context.Context, r *kafkago.Reader, capacity int) <-chan kafkago.Message {
	out := make(chan kafkago.Message, capacity)
	go func() {
		defer close(out)
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				return
			}
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// kafkaBatches runs workers group members, each taking batches of up to
// size messages (queue capacity 2 × size) and handing them to do, then
// committing the batch's highest offset per partition in one request.
func (k *kafkaBroker) kafkaBatches(ctx context.Context, e *runEnv, t *tracker, size, workers int, do func([]msg) (won int, err error)) (*counts, error) {
	var c counts
	rs := make([]*kafkago.Reader, workers)
	for i := range rs {
		rs[i] = k.reader(e.queue, e.consumer, 2*size)
	}
	defer closeReaders(rs)
	pctx, stopPumps := context.WithCancel(ctx)
	defer stopPumps()
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for _, r := range rs {
		ch := fetchPump(pctx, r, 2*size)
		wg.Go(func() {
			buf := make([]kafkago.Message, 0, size)
			ms := make([]msg, 0, size)
			for {
				b, err := nextMsgs(ctx, ch, buf, size)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				ms = ms[:0]
				for i := range b {
					ms = append(ms, kafkaMsg(&b[i]))
				}
				var won int
				for {
					if won, err = do(ms); err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
					c.retried.Add(int64(len(ms)))
					time.Sleep(10 * time.Millisecond)
				}
				c.processed.Add(int64(won))
				c.duplicates.Add(int64(len(ms) - won))
				for i := range ms {
					t.decided(ms[i].id, ms[i].ts)
				}
				t.batches.Add(1)
				if err := r.CommitMessages(ctx, b...); err != nil {
					if ctx.Err() == nil {
						errc <- fmt.Errorf("offset commit: %w", err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return &c, err
	default:
	}
	return &c, nil
}

// handBatch is the hand-tuned batch consumer on kafka-go: batches of up to
// size, one store transaction (batchTx), one offset commit.
func (k *kafkaBroker) handBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error) {
	return k.kafkaBatches(ctx, e, t, size, workers, func(b []msg) (int, error) { return e.store.batchTx(ctx, e, b) })
}

// rawAck fetches and commits offsets in batches of size, no database.
func (k *kafkaBroker) rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error) {
	return k.kafkaBatches(ctx, e, t, size, 1, func(b []msg) (int, error) { return len(b), nil })
}
