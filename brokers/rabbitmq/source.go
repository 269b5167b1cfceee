package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/internal/retry"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/unsettled"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/option"
	"github.com/idemq/idemq/internal/redact"
)

// errChannelClosed is the reason of a stale settlement: the delivery's
// channel closed, and its delivery tag died with it, so nothing is sent.
var errChannelClosed = errors.New("rabbitmq: the delivery's channel is closed")

// Source consumes one RabbitMQ queue. It implements driver.Source,
// driver.BatchSettler, driver.WindowSetter and driver.RedeliveryHorizoner.
// It is safe for concurrent use.
type Source struct {
	nodes nodes
	queue string
	cfg   config

	// next is the index of the node the next dial tries first. Open and
	// then run (one at a time) use it.
	next int

	ctx    context.Context // cancelled by Close; bounds dials and backoff sleeps
	cancel context.CancelFunc

	mu      sync.Mutex
	window  int
	started bool
	closed  bool
	sess    *session         // current session, nil while reconnecting
	initial *amqp.Connection // the connection Open made, used by the first session
	timers  map[*time.Timer]struct{}

	// attempts remembers, per message id, the attempt of messages this
	// process requeued with RetryRequeue: a classic queue only flags a
	// redelivery, so without it Attempt would stop at 2 and MaxAttempts
	// would never be reached. Bounded by maxRemembered.
	attemptsMu sync.Mutex
	attempts   map[string]int

	out  chan *delivery // converted deliveries waiting for Receive (outBuffer)
	errs chan error     // connection trouble reported to Receive, never blocks the loop
	wg   sync.WaitGroup

	// log is the logger in use: cfg.logger when given, else the
	// Consumer's (SetLogger), else slog.Default().
	logs unsettled.Logger

	reconnects atomic.Int64
	// isolate is set when the connection died because the client could
	// not parse a frame (amqp091-go refuses a message with more than 8192
	// headers and drops the connection): the next session consumes one
	// message at a time until the unparseable one is behind it, so the
	// messages behind it are not returned with it on every drop (and, with
	// a delivery limit, parked with it). The drop returned at most a window
	// of messages, each flagged redelivered, ahead of any never delivered:
	// a message that parses and was never delivered, or a window's worth
	// that parsed, means the unparseable one is gone.
	isolate atomic.Bool
	// isolatedParsed counts the redelivered messages that parsed while
	// isolated. Only the run goroutine uses it.
	isolatedParsed int
	// isolations counts sessions started that way.
	isolations    atomic.Int64
	stale         atomic.Int64
	multipleAcks  atomic.Int64
	multipleCount atomic.Int64
}

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	// Reconnects counts sessions re-established after a connection or
	// channel loss.
	Reconnects int64
	// StaleSettlements counts settlements refused because the delivery's
	// channel had closed (errors wrapping driver.ErrStaleDelivery).
	StaleSettlements int64
	// MultipleAcks counts basic.ack calls with multiple=true made by
	// AckBatch, and MultipleAcked the deliveries they covered.
	MultipleAcks, MultipleAcked int64
	// Isolations counts sessions that consumed one message at a time
	// because the previous connection died on a message the client could
	// not parse (see WithDeliveryLimit).
	Isolations int64
}

// sourceConfig checks what Open is given before it dials (the queue,
// unless an option names it, and the options), and splits url, without
// idemq's parameters, into its nodes.
func sourceConfig(url, queue string, opts []Option) (config, nodes, error) {
	cfg := defaultConfig(queue)
	if err := option.Apply(&cfg, opts...); err != nil {
		return config{}, nodes{}, err
	}
	if cfg.queue == "" {
		return config{}, nodes{}, errors.New("rabbitmq: no queue named: give the URL parameter queue= or the option WithQueue")
	}
	if err := checkName(cfg.queue); err != nil {
		return config{}, nodes{}, fmt.Errorf("rabbitmq: queue: %w", err)
	}
	cfg.deadLetterQueue = cmp.Or(cfg.deadLetterQueue, cfg.queue+".dlq")
	cfg.retryQueue = cmp.Or(cfg.retryQueue, cfg.queue+".retry")
	if cfg.deliveryLimit > 0 && cfg.queueType != Quorum {
		return config{}, nodes{}, fmt.Errorf("rabbitmq: WithDeliveryLimit: needs WithQueueType(Quorum) (queue type is %q)", cfg.queueType)
	}
	ns, err := parseNodes(url)
	if err != nil {
		return config{}, nodes{}, err
	}
	return cfg, ns, nil
}

// Open connects to the broker at addr and returns a Source for the queue
// its queue parameter (or WithQueue) names. It declares the topology
// unless WithDeclare(false) is given (then it checks that the queues
// exist). Consumption starts at the first Receive, after the Consumer had
// its chance to call SetWindow.
//
//	amqp://user:pass@host:5672/vhost?queue=payments&queue_type=quorum&retry=queue
//	amqps://user:pass@h1:5671,h2:5671,h3:5671/vhost?queue=payments&queue_type=quorum&delivery_limit=5
//
// A cluster's nodes are listed comma-separated in place of host:port, each
// with the same user, password, vhost and parameters. The first connection
// goes to a node picked at random, so that many consumers spread over the
// cluster; a failed dial tries the next node at once, and only when every
// node failed in turn does the Source wait out its reconnect backoff. After
// a connection loss it starts with the node after the one it lost. An empty
// entry or a port that is not a number is an error naming it.
//
// Parameters, each the option of the same meaning (options given in code
// apply after the URL's):
//
//	queue            the queue to consume (required)     (WithQueue)
//	queue_type       classic | quorum                      (WithQueueType)
//	retry            requeue | queue                       (WithRetryMode)
//	dead_letter      republish | reject                    (WithDeadLetterMode)
//	declare          true | false                          (WithDeclare)
//	prefetch         1..65535                              (WithPrefetch)
//	delivery_limit   0.. (quorum queues)                   (WithDeliveryLimit)
//	message_ttl      a duration, e.g. 168h                 (WithMessageTTL)
//	policy_ttl       a duration, e.g. 72h                  (WithPolicyTTL)
//	dead_letter_queue, retry_queue                         (WithDeadLetterQueue, WithRetryQueue)
//	connection_name  the client connection name            (WithConnectionName)
//	exchange         the exchange producers publish to     (WithExchange)
//	id_header        the header holding the business id    (WithIDHeader)
//
// RabbitMQ's own URI parameters (heartbeat, connection_timeout,
// channel_max, auth_mechanism, and for amqps:// cacertfile, certfile,
// keyfile and server_name_indication) are left to amqp091-go, which checks
// the server against cacertfile (default: the system roots) and its host
// name. Any other parameter is an error naming it.
func Open(ctx context.Context, addr string, opts ...Option) (*Source, error) {
	cfg, ns, err := openConfig(addr, opts)
	if err != nil {
		return nil, err
	}
	s := &Source{
		nodes:    ns,
		next:     rand.IntN(len(ns.urls)),
		queue:    cfg.queue,
		cfg:      cfg,
		window:   cfg.prefetch,
		timers:   make(map[*time.Timer]struct{}),
		attempts: make(map[string]int),
		// Buffered so the pump converts ahead while the Consumer is busy,
		// without a goroutine hand-off per message; what waits here is
		// within the broker's prefetch, so memory stays bounded by it.
		out:  make(chan *delivery, outBuffer),
		errs: make(chan error, 1),
	}
	s.logs.Init(cfg.logger)
	conn, err := s.dialAndDeclare(ctx)
	if err != nil {
		return nil, err
	}
	s.initial = conn
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Queue returns the name of the consumed queue.
func (s *Source) Queue() string { return s.queue }

// RedeliveryHorizon implements driver.RedeliveryHorizoner: twice the
// WithMessageTTL the Source declared its queue and dead-letter queue with,
// or the WithPolicyTTL a policy gives them (a message waits at most that
// long in each), or else unbounded. A
// RabbitMQ queue, and the dead-letter queue a parked message can be
// redriven from, keep a message until it is consumed (a TTL set by a
// server-side policy is not visible to a client), so a store that prunes
// claims can meet a redelivery of a message whose claim is gone: the
// Consumer warns, or refuses to start with core.WithStrictRetention.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
	// Where both a queue argument and a policy set a TTL, RabbitMQ applies
	// the lower one.
	ttl := s.cfg.policyTTL
	if s.cfg.messageTTL > 0 && s.cfg.declare && (ttl == 0 || s.cfg.messageTTL < ttl) {
		ttl = s.cfg.messageTTL
	}
	if ttl > 0 {
		return 2 * ttl, true
	}
	return driver.Unbounded, true
}

// HorizonHint implements driver.HorizonHinter: a TTL of at most half the
// retention on the queue and its dead-letter queue, as a URL parameter for
// a queue the Source declares, or as a policy for one that exists (a
// declared queue's arguments cannot change: declaring it again with
// message_ttl fails with PRECONDITION_FAILED).
func (s *Source) HorizonHint(retention time.Duration) string {
	ttl := (retention / 2).Truncate(time.Second)
	if ttl <= 0 {
		ttl = retention / 2
	}
	pattern := "^(" + regexp.QuoteMeta(s.queue) + "|" + regexp.QuoteMeta(s.cfg.deadLetterQueue) + ")$"
	return fmt.Sprintf("give queue %s and its dead-letter queue %s a message TTL of at most %v: for an existing queue, "+
		"rabbitmqctl set_policy idemq-ttl '%s' '{\"message-ttl\":%d}' --apply-to queues, then policy_ttl=%v on the URL; "+
		"for a queue not yet declared, message_ttl=%v on the URL",
		s.queue, s.cfg.deadLetterQueue, ttl, pattern, ttl.Milliseconds(), ttl, ttl)
}

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	return Stats{
		Reconnects:       s.reconnects.Load(),
		StaleSettlements: s.stale.Load(),
		MultipleAcks:     s.multipleAcks.Load(),
		MultipleAcked:    s.multipleCount.Load(),
		Isolations:       s.isolations.Load(),
	}
}

// SetLogger implements driver.LoggerSetter: the Consumer hands over its
// logger, which the Source uses unless WithLogger gave one.
func (s *Source) SetLogger(l *slog.Logger) { s.logs.SetLogger(l) }

// logger returns the logger in use.
func (s *Source) logger() *slog.Logger { return s.logs.Log() }

// SetWindow sets the QoS prefetch to the Consumer's in-flight window, so the
// broker never hands over more unacked messages than the Consumer holds.
// Windows above AMQP's limit of 65535 use 65535. It applies to the current
// channel at once and to every channel after a reconnect.
func (s *Source) SetWindow(n int) error {
	if n < 1 {
		return fmt.Errorf("rabbitmq: SetWindow: window %d is below 1", n)
	}
	n = min(n, 65535)
	s.mu.Lock()
	s.window = n
	sess := s.sess
	s.mu.Unlock()
	if sess != nil {
		if err := sess.ch.Qos(n, 0, false); err != nil {
			return fmt.Errorf("rabbitmq: SetWindow: %w", err)
		}
	}
	return nil
}

// Receive returns the next delivery. It blocks until one arrives, ctx is
// done, or the Source is closed (driver.ErrSourceClosed). While the connection
// is down it keeps reconnecting in the background and may return the
// connection error to report trouble; calling Receive again is always safe.
func (s *Source) Receive(ctx context.Context) (driver.Delivery, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, driver.ErrSourceClosed
	}
	if !s.started {
		s.started = true
		s.wg.Add(1)
		go s.run()
	}
	s.mu.Unlock()
	for {
		// Under load a delivery is nearly always waiting: take it without
		// the four-way select below.
		select {
		case d := <-s.out:
			if d.sess.ch.IsClosed() {
				continue // as below
			}
			return d, nil
		default:
		}
		select {
		case d := <-s.out:
			if d.sess.ch.IsClosed() {
				// Its tag died with the channel: the broker redelivers it,
				// so handing it over would only waste a transaction.
				continue
			}
			return d, nil
		case err := <-s.errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, driver.ErrSourceClosed
		}
	}
}

// Close stops consuming and closes the connection. Deliveries not yet
// settled (including pending RetryRequeue delays) are requeued by the
// broker; settling them afterwards returns an error wrapping
// driver.ErrStaleDelivery.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	initial := s.initial
	s.initial = nil
	for t := range s.timers {
		if t.Stop() {
			s.wg.Done()
		}
	}
	clear(s.timers)
	s.mu.Unlock()
	s.cancel()
	var err error
	// Whoever takes s.initial under s.mu owns it: run (once started) or,
	// if run has not taken it yet, Close.
	if initial != nil {
		err = initial.Close()
	}
	s.wg.Wait()
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

// dial opens a connection to one of the nodes, trying each once in turn
// from s.next, and leaves s.next at the node after the one it reached.
// It gives up when ctx is done.
func (s *Source) dial(ctx context.Context) (*amqp.Connection, error) {
	conn, next, err := dialNodes(ctx, s.nodes, s.next, s.cfg.connConfig)
	s.next = next
	return conn, err
}

// dialNodes tries each node once, from node first on, and returns the
// first connection made and the index of the node after it; when every
// node failed, the error joins each node's, and the index is first's.
func dialNodes(ctx context.Context, ns nodes, first int, cc connConfig) (*amqp.Connection, int, error) {
	n := len(ns.urls)
	var errs []error
	for k := range n {
		i := (first + k) % n
		conn, err := dialContext(ctx, ns.urls[i], cc)
		if err == nil {
			return conn, (i + 1) % n, nil
		}
		if msg := redact.Error(err, ns.urls[i]); msg != err.Error() {
			err = errors.New(msg)
		}
		if n > 1 {
			err = fmt.Errorf("node %s: %w", ns.host(i), err)
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first, errors.Join(errs...)
}

// dialContext runs amqp.DialConfig, which takes no context, so that ctx
// can abandon it; a connection that arrives too late is closed.
func dialContext(ctx context.Context, url string, cc connConfig) (*amqp.Connection, error) {
	cfg, name := cc.dial, cc.connName
	if !cc.dialSet {
		cfg = amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"}
	}
	if cfg.Properties == nil {
		cfg.Properties = amqp.NewConnectionProperties()
	} else {
		p := make(amqp.Table, len(cfg.Properties)+1)
		for k, v := range cfg.Properties {
			p[k] = v
		}
		cfg.Properties = p
	}
	if _, ok := cfg.Properties["connection_name"]; !ok {
		cfg.Properties.SetClientConnectionName(name)
	}
	if cfg.Dial == nil {
		timeout := 30 * time.Second // amqp091-go's default
		if u, err := amqp.ParseURI(url); err == nil && u.ConnectionTimeout > 0 {
			timeout = time.Duration(u.ConnectionTimeout) * time.Millisecond
		}
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake has no heartbeats yet; amqp091-go clears this
			// deadline once the connection is open.
			return c, c.SetDeadline(time.Now().Add(timeout))
		}
	}
	type result struct {
		c   *amqp.Connection
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := amqp.DialConfig(url, cfg)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// dialAndDeclare connects and declares (or checks) the topology.
func (s *Source) dialAndDeclare(ctx context.Context) (*amqp.Connection, error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connect: %w", err)
	}
	if err := declare(conn, s.queue, s.cfg); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// run owns the connection: it starts a session, pumps its deliveries to
// Receive, and when the connection or channel dies reconnects until Close:
// at once, to the next node, and after a round in which no node could be
// reached or the session not started, after a backoff that starts over
// once a session runs again.
func (s *Source) run() {
	defer s.wg.Done()
	s.mu.Lock()
	conn := s.initial
	s.initial = nil
	s.mu.Unlock()
	backoff := retry.New(s.cfg.backoffMin, s.cfg.backoffMax)
	// failed logs and reports err and waits out the backoff; false when
	// the Source closed meanwhile.
	failed := func(what string, err error) bool {
		if s.ctx.Err() != nil {
			return false
		}
		wait := backoff.Next()
		s.logger().Warn("idemq rabbitmq: "+what+" failed", "queue", s.queue, "error", err, "retry_in", wait)
		s.report(err)
		return retry.Sleep(s.ctx, wait)
	}
	lost := false
	for s.ctx.Err() == nil {
		if conn == nil {
			c, err := s.dialAndDeclare(s.ctx)
			if err != nil {
				if !failed("reconnect", err) {
					return
				}
				continue
			}
			conn = c
		}
		sess, deliveries, err := s.startSession(conn)
		if err != nil {
			conn.Close()
			conn = nil
			if !failed("consume", err) {
				return
			}
			continue
		}
		node := s.nodes.host((s.next + len(s.nodes.urls) - 1) % len(s.nodes.urls))
		if lost {
			s.reconnects.Add(1)
			s.logger().Info("idemq rabbitmq: reconnected", "queue", s.queue, "node", node, "reconnects", s.reconnects.Load())
		}
		backoff.Reset()
		select { // an error reported before this session is no longer news
		case <-s.errs:
		default:
		}
		reason := s.pump(sess, deliveries)
		s.mu.Lock()
		if s.sess == sess {
			s.sess = nil
		}
		s.mu.Unlock()
		sess.kill()
		conn.Close()
		conn = nil
		if s.ctx.Err() != nil {
			return
		}
		lost = true
		s.logger().Warn("idemq rabbitmq: connection lost, reconnecting", "queue", s.queue, "node", node, "reason", reason)
	}
}

// outBuffer is how many converted deliveries may wait for Receive.
const outBuffer = 128

// maxRemembered bounds the requeued-attempt memory.
const maxRemembered = 10000

// remember records that the message with id was requeued after attempt.
func (s *Source) remember(id string, attempt int) {
	if id == "" {
		return
	}
	s.attemptsMu.Lock()
	defer s.attemptsMu.Unlock()
	if _, ok := s.attempts[id]; !ok && len(s.attempts) >= maxRemembered {
		for k := range s.attempts { // evict an arbitrary entry
			delete(s.attempts, k)
			break
		}
	}
	s.attempts[id] = attempt
}

// requeued returns the attempt after which id was last requeued (0 if
// unknown).
func (s *Source) requeued(id string) int {
	s.attemptsMu.Lock()
	defer s.attemptsMu.Unlock()
	return s.attempts[id]
}

// forget drops id once it is acked or dead-lettered.
func (s *Source) forget(id string) {
	s.attemptsMu.Lock()
	defer s.attemptsMu.Unlock()
	delete(s.attempts, id)
}

// forgetAll is forget for each of ds, under one lock: AckBatch's.
func (s *Source) forgetAll(ds []*delivery) {
	s.attemptsMu.Lock()
	defer s.attemptsMu.Unlock()
	if len(s.attempts) == 0 {
		return // nothing was requeued: the common case
	}
	for _, d := range ds {
		delete(s.attempts, d.id)
	}
}

// report hands err to a waiting Receive without ever blocking.
func (s *Source) report(err error) {
	select {
	case s.errs <- fmt.Errorf("rabbitmq: %w", err):
	default:
	}
}

// startSession opens the consume channel on conn, applies the window and
// starts consuming.
func (s *Source) startSession(conn *amqp.Connection) (*session, <-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	window := s.window
	s.mu.Unlock()
	tag := s.cfg.consumerTag
	if s.isolate.Load() {
		window = 1
		s.isolations.Add(1)
		// A tag of its own, to cancel this consumer once a message parsed.
		tag = fmt.Sprintf("idemq-isolating-%d", s.isolations.Load())
	}
	if err := ch.Qos(window, 0, false); err != nil {
		ch.Close()
		return nil, nil, err
	}
	sess := &session{
		src:    s,
		conn:   conn,
		ch:     ch,
		dead:   make(chan struct{}),
		closed: ch.NotifyClose(make(chan *amqp.Error, 1)),
		live:   unsettled.New[uint64, struct{}](0, 0),
	}
	deliveries, err := ch.Consume(s.queue, tag, false, false, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, nil, err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	return sess, deliveries, nil
}

// pump registers each delivery's tag as outstanding before handing it to
// Receive, in tag order: AckBatch relies on every tag below an outstanding
// one being known. It returns why the session ended.
func (s *Source) pump(sess *session, deliveries <-chan amqp.Delivery) string {
	for {
		select {
		case <-s.ctx.Done():
			return "closed"
		case e := <-sess.closed:
			if unparseable(e) {
				s.isolate.Store(true)
				s.isolatedParsed = 0
			}
			return closeReason(e)
		case raw, ok := <-deliveries:
			if !ok {
				// The consumer was cancelled (queue deleted, or the channel
				// closed): a fresh session re-checks the topology.
				return "consumer cancelled or channel closed"
			}
			if s.isolate.Load() && s.passedUnparseable(raw.Redelivered) {
				s.isolate.Store(false)
				// The unparseable message is gone. A consumer's prefetch
				// is fixed when it starts: start one with the full window,
				// then cancel the one-at-a-time consumer, which holds only
				// this message (its next comes after an ack), so delivery
				// tags stay in order.
				next, err := s.unisolate(sess)
				if err != nil {
					return "leaving one-at-a-time consumption: " + err.Error()
				}
				deliveries = next
			}
			e := sess.live.Add(raw.DeliveryTag, struct{}{})
			if e == nil {
				return "channel closed"
			}
			d := s.newDelivery(sess, e, raw)
			select {
			case s.out <- d:
			case <-s.ctx.Done():
				return "closed"
			case e := <-sess.closed:
				// d's tag died with the channel; the broker redelivers it.
				return closeReason(e)
			}
		}
	}
}

// newDelivery converts raw, received on sess as e, into a delivery.
func (s *Source) newDelivery(sess *session, e *unsettled.Entry[uint64, struct{}], raw amqp.Delivery) *delivery {
	d := &delivery{sess: sess, e: e, tag: raw.DeliveryTag, raw: raw}
	m := &d.msg
	d.idErr = fillMessage(m, s.queue, s.cfg.idHeader, &d.raw)
	d.id = m.ID
	if d.idErr != nil {
		s.logger().Warn("idemq rabbitmq: message without a usable id; the Consumer dead-letters it", "queue", s.queue, "delivery_tag", raw.DeliveryTag, "error", d.idErr)
	}
	if raw.Redelivered {
		if n := s.requeued(d.id); n+1 > m.Attempt {
			m.Attempt = n + 1
		}
	}
	return d
}

// passedUnparseable tells, for a message that parsed while isolated,
// whether the unparseable message is behind it: it was never delivered, or
// a window of returned messages parsed.
func (s *Source) passedUnparseable(redelivered bool) bool {
	if !redelivered {
		return true
	}
	s.isolatedParsed++
	s.mu.Lock()
	window := s.window
	s.mu.Unlock()
	return s.isolatedParsed >= window
}

// unparseable tells a connection the client dropped because it could not
// parse a frame from one that was lost or closed.
func unparseable(e *amqp.Error) bool {
	return e != nil && e.Code == amqp.FrameError && !e.Server && !strings.Contains(e.Reason, "EOF") &&
		(strings.Contains(e.Reason, "invalid field") || strings.Contains(e.Reason, "frame could not be parsed") || strings.Contains(e.Reason, "frame size"))
}

// unisolate replaces the session's one-at-a-time consumer by one with the
// full window and returns its deliveries.
func (s *Source) unisolate(sess *session) (<-chan amqp.Delivery, error) {
	s.mu.Lock()
	window := s.window
	s.mu.Unlock()
	if err := sess.ch.Qos(window, 0, false); err != nil {
		return nil, err
	}
	next, err := sess.ch.Consume(s.queue, s.cfg.consumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	if err := sess.ch.Cancel(fmt.Sprintf("idemq-isolating-%d", s.isolations.Load()), false); err != nil {
		return nil, err
	}
	return next, nil
}

func closeReason(e *amqp.Error) string {
	if e == nil {
		return "channel closed"
	}
	return e.Error()
}

// AckBatch acknowledges deliveries of this Source. Per channel it sends one
// basic.ack with multiple=true for the longest run of the batch's lowest
// tags below which no other delivery is outstanding, and single acks for
// the rest, because a multiple ack also acknowledges tags still in flight.
// Deliveries whose channel closed are not acked (driver.ErrStaleDelivery); the
// returned error joins one error per delivery that failed.
func (s *Source) AckBatch(ctx context.Context, ds []driver.Delivery) error {
	// Per session, in order of first appearance: nearly always one, so a
	// slice searched in turn rather than a map.
	type group struct {
		sess *session
		ds   []*delivery
	}
	var groups []group
	own, errs := unsettled.Take("rabbitmq", ds, func(cd driver.Delivery) (*delivery, bool) {
		d, ok := cd.(*delivery)
		return d, ok && d.sess.src == s
	}, func(d *delivery) error { return d.wrap(d.Claim()) })
	for _, d := range own {
		i := slices.IndexFunc(groups, func(g group) bool { return g.sess == d.sess })
		if i < 0 {
			i = len(groups)
			groups = append(groups, group{sess: d.sess, ds: make([]*delivery, 0, len(ds))})
		}
		groups[i].ds = append(groups[i].ds, d)
	}
	for _, g := range groups {
		if err := g.sess.ackBatch(g.ds); err != nil {
			errs = append(errs, err)
		}
		s.forgetAll(g.ds)
	}
	return errors.Join(errs...)
}
