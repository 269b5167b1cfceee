package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
)

// A run is a broker side and a store side. Each side has what the
// configurations need from it: the broker declares, fills and removes a
// queue and runs the raw-driver consumers; the store sets up and checks the
// tables, runs the seed and hand-batch transactions for those consumers,
// and runs the idemq configurations (whose handlers depend on the store's
// transaction type). The two are independent: any broker with any store.

// brokerSide is one broker (RabbitMQ, Kafka, SQS, Pub/Sub, NATS
// JetStream, Redis Streams) as the benchmark uses it.
type brokerSide interface {
	// kind names the broker in descriptions ("RabbitMQ", "Kafka", "SQS").
	kind() string
	// version returns the server's product and version, for the report.
	version(ctx context.Context) string
	// ping fails when the broker cannot be reached.
	ping(ctx context.Context) error
	// baseQueue is the queue (topic) name each run appends a suffix to.
	baseQueue() string
	// sourceURL is Config.Broker pointed at queue, for core.OpenSource,
	// with group is the idemq consumer's name (Kafka consumer group).
	sourceURL(queue, group string) string
	// declare creates queue (and the queues idemq's adapter needs beside
	// it) before anything is published or consumed.
	declare(ctx context.Context, queue string) error
	// remove deletes what declare created.
	remove(queue string) error
	// publishBacklog publishes the workload's backlog and returns once the
	// broker has every message.
	publishBacklog(ctx context.Context, queue string, w *workload) error
	// publishPaced publishes paced messages at rate per second until count
	// were sent or, once minCount were, stop closes (nil: no stop), and
	// returns how many it sent.
	publishPaced(ctx context.Context, queue string, w *workload, rate, count, minCount int, stop <-chan struct{}) (int, error)
	// seed runs the seed-style consumer (one store transaction per
	// message, then its ack) with the given prefetch and workers until ctx
	// ends.
	seed(ctx context.Context, e *runEnv, t *tracker, prefetch, workers int) (*counts, error)
	// handBatch runs the hand-tuned batch consumer: batches of up to size,
	// one store transaction and one broker acknowledgement per batch,
	// workers batches at once.
	handBatch(ctx context.Context, e *runEnv, t *tracker, size, workers int) (*counts, error)
	// rawAck consumes and acknowledges in batches of size with no
	// database.
	rawAck(ctx context.Context, e *runEnv, t *tracker, size int) (*counts, error)
	// describe returns a broker-specific description of a baseline, or ""
	// for Describe's.
	describe(name string) string
	close()
}

// storeSide is one database (Postgres, MariaDB/MySQL) as the benchmark
// uses it.
type storeSide interface {
	// version returns the server's version, for the report.
	version(ctx context.Context) string
	// setup creates the run's accounts (all at zero) and, when dedup is
	// set, the baselines' dedup table.
	setup(ctx context.Context, e *runEnv, dedup bool) error
	// drop removes the run's tables (the dedup table unless e.keepDedup).
	drop(ctx context.Context, e *runEnv)
	// seedTx is the seed pattern's transaction for one message: claim,
	// and when won the UPDATE and COMMIT; dup reports a lost claim.
	seedTx(ctx context.Context, e *runEnv, m *msg) (dup bool, err error)
	// batchTx is the hand-tuned batch transaction: one multi-row claim of
	// the batch's distinct ids, one set-based UPDATE of the sums per
	// account, one commit; re-run on a deadlock. It returns how many
	// deliveries won a claim.
	batchTx(ctx context.Context, e *runEnv, b []msg) (won int, err error)
	// check is the correctness check (see session.check).
	check(ctx context.Context, e *runEnv, paced int) error
	// runIdemq runs an idemq configuration over e's queue and tables until
	// ctx ends.
	runIdemq(ctx context.Context, e *runEnv, t *tracker, name string) (*counts, error)
	// idemqStoreURL is Config.Store with table as the dedup table and a
	// pool of conns connections, for core.OpenStore.
	idemqStoreURL(table string, conns int) string
	// describe returns a store-specific description of a configuration,
	// or "" for Describe's.
	describe(name string) string
	close()
}

// msg is one delivery as the raw consumers see it: its business id, body
// and publish time (Unix nanos; 0 if unknown).
type msg struct {
	id   string
	body []byte
	ts   int64
}

// decodePayment decodes a message body.
func decodePayment(body []byte) (payment, error) {
	var p payment
	err := json.Unmarshal(body, &p)
	return p, err
}

// batchPayments decodes a batch's payments, keeping the first delivery of
// each id, and returns the ids sorted (so concurrent batches lock keys in
// one order) with their payments.
func batchPayments(b []msg) ([]string, map[string]payment, error) {
	pays := make(map[string]payment, len(b))
	ids := make([]string, 0, len(b))
	for i := range b {
		id := b[i].id
		if _, ok := pays[id]; ok {
			continue // the same id twice in one batch: claimed once
		}
		var p payment
		if err := json.Unmarshal(b[i].body, &p); err != nil {
			return nil, nil, err
		}
		pays[id] = p
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, pays, nil
}

// sumByAccount adds up the amounts of the ids won per account and returns
// the accounts sorted (so concurrent batches lock rows in one order) with
// their sums.
func sumByAccount(won []string, pays map[string]payment) ([]string, []int64) {
	sums := map[string]int64{}
	for _, id := range won {
		p := pays[id]
		sums[p.Account] += p.AmountCents
	}
	accs := make([]string, 0, len(sums))
	for a := range sums {
		accs = append(accs, a)
	}
	slices.Sort(accs)
	amts := make([]int64, len(accs))
	for i, a := range accs {
		amts[i] = sums[a]
	}
	return accs, amts
}

// nextMsgs takes one item (blocking) and then as many more as are already
// buffered, up to size: like idemq's batcher without linger, a batch fills
// up while the previous one is being processed.
func nextMsgs[T any](ctx context.Context, ch <-chan T, buf []T, size int) ([]T, error) {
	buf = buf[:0]
	select {
	case d, ok := <-ch:
		if !ok {
			return nil, errors.New("delivery channel closed")
		}
		buf = append(buf, d)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(buf) < size {
		select {
		case d, ok := <-ch:
			if !ok {
				return buf, nil
			}
			buf = append(buf, d)
		default:
			return buf, nil
		}
	}
	return buf, nil
}

// openBroker returns the broker side for Config.Broker's scheme.
func openBroker(ctx context.Context, broker string) (brokerSide, error) {
	u, err := url.Parse(broker)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Broker: not a URL")
	}
	switch u.Scheme {
	case "amqp", "amqps":
		return newRabbit(broker)
	case "kafka":
		return newKafka(u)
	case "sqs":
		return newSQS(ctx, u)
	case "pubsub":
		return newPubSub(ctx, u)
	case "nats":
		return newNATS(u)
	case "redis", "rediss":
		return newRedis(u)
	}
	return nil, fmt.Errorf("benchmark: Config.Broker: scheme %q is not supported (%s)", u.Scheme, BrokerSchemes)
}

// openStore returns the store side for Config.Store's scheme, connected.
func openStore(ctx context.Context, store string) (storeSide, error) {
	u, err := url.Parse(store)
	if err != nil {
		return nil, fmt.Errorf("benchmark: Config.Store: not a URL")
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		return newPostgres(ctx, u)
	case "mysql":
		return newMySQL(ctx, u)
	}
	return nil, fmt.Errorf("benchmark: Config.Store: scheme %q is not supported (%s)", u.Scheme, StoreSchemes)
}

// BrokerSchemes and StoreSchemes list the URL schemes Config.Broker and
// Config.Store accept, for help texts.
const (
	BrokerSchemes = "amqp, amqps, kafka, sqs, pubsub, nats, redis, rediss"
	StoreSchemes  = "postgres, postgresql, mysql"
)
