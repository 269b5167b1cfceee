package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/hostlist"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/retry"
)

// Source consumes one RabbitMQ queue. It implements driver.Puller,
// driver.Releaser, driver.RedeliveryHorizoner and driver.HorizonHinter.
// It is safe for concurrent use.
type Source struct {
	*dialer // Open, then run (one at a time), dial with it
	cfg     config

	ctx    context.Context // cancelled by Close; bounds dials and backoff sleeps
	cancel context.CancelFunc

	mu       sync.Mutex
	sess     *session         // current session, nil while reconnecting
	sessions uint64           // sessions started, to order them
	initial  *amqp.Connection // Open's connection, for the first session

	window int          // the Consumer's window: the QoS prefetch; set by Start
	log    *slog.Logger // WithLogger's, else the Consumer's; set by Start at the latest
	// attempts remembers the attempt of messages requeued by RetryRequeue:
	// a classic queue only flags a redelivery, so Attempt would stop at 2.
	attempts *attempts.Memo[string]

	out  chan *delivery // deliveries waiting for Receive
	errs chan error     // connection trouble for Receive, never blocks run
	wg   sync.WaitGroup

	// isolate is set when the client dropped the connection on a frame it
	// could not parse (amqp091-go refuses more than 8192 headers): the next
	// session consumes one message at a time until the unparseable one is
	// behind it, so the messages behind it are not returned (and, with a
	// delivery limit, parked) with it on every drop. The drop returned at
	// most a window of messages, each flagged redelivered, ahead of any never
	// delivered: one never delivered, or a window that parsed, means it is gone.
	isolate        atomic.Bool
	isolatedParsed int // redelivered messages parsed while isolated; run's own

	reconnects, stale, multipleAcks, multipleCount, isolations atomic.Int64 // Stats', in its order

	ackDelay atomic.Int64 // how long an ack waits for the tags below it, ns (see sendLocked)
}

// Stats are counters of a Source's life, for operators and tests.
type Stats struct {
	Reconnects       int64 // sessions re-established after a connection or channel loss
	StaleSettlements int64 // messages not settled because their channel had closed
	MultipleAcks     int64 // basic.ack and basic.nack calls with multiple=true
	MultipleAcked    int64 // the deliveries those covered
	Isolations       int64 // sessions consuming one message at a time after one the client could not parse (see WithDeliveryLimit)
}

var (
	_ driver.Puller        = (*Source)(nil)
	_ driver.Releaser      = (*Source)(nil)
	_ driver.HorizonHinter = (*Source)(nil)
)

// sourceConfig checks what Open is given before it dials: the options
// (the queue among them, unless given as queue) and url, without idemq's
// parameters, split into its nodes.
func sourceConfig(url, queue string, opts []Option) (config, hostlist.List, error) {
	cfg := defaultConfig(queue)
	if err := option.Apply(&cfg, opts...); err != nil {
		return config{}, hostlist.List{}, err
	}
	if cfg.queue == "" {
		return config{}, hostlist.List{}, errors.New("rabbitmq: no queue named: give the URL parameter queue= or the option WithQueue")
	}
	if cfg.deliveryLimit > 0 && cfg.queueType != Quorum {
		return config{}, hostlist.List{}, fmt.Errorf("rabbitmq: WithDeliveryLimit: needs WithQueueType(Quorum) (queue type is %q)", cfg.queueType)
	}
	cfg.deadLetterQueue = cmp.Or(cfg.deadLetterQueue, cfg.queue+".dlq")
	cfg.retryQueue = cmp.Or(cfg.retryQueue, cfg.queue+".retry")
	cfg.consumerTag = cmp.Or(cfg.consumerTag, "idemq") // unique enough: the channel is the Source's own
	ns, err := parseNodes(url)
	return cfg, ns, err
}

// Open connects to the broker at addr and returns a Source for the queue
// its queue parameter (or WithQueue) names. It declares the topology
// unless WithDeclare(false) is given (then it checks that the queues
// exist). Consumption starts when the Consumer starts the Source, with a
// QoS prefetch of the Consumer's window.
//
//	amqp://user:pass@host:5672/vhost?queue=payments&queue_type=quorum&retry=queue
//	amqps://user:pass@h1:5671,h2:5671,h3:5671/vhost?queue=payments&queue_type=quorum&delivery_limit=5
//
// A cluster's nodes are listed comma-separated in place of host:port, each
// with the same user, password, vhost and parameters. The first dial goes
// to a node picked at random, a failed one tries the next node at once,
// and only when every node failed in turn does the Source wait out its
// reconnect backoff; after a connection loss it starts with the node after
// the one it lost.
//
// Each parameter sets the option of the same meaning; options given in
// code apply after the URL's. queue (WithQueue) is required; queue_type is
// classic or quorum (WithQueueType), retry requeue or queue
// (WithRetryMode), dead_letter republish or reject (WithDeadLetterMode),
// message_ttl and policy_ttl are durations; declare, delivery_limit,
// dead_letter_queue, retry_queue, connection_name, exchange and id_header
// take the values of their options.
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
		dialer:   hostlist.NewDialer(ns, cfg.open),
		cfg:      cfg,
		log:      cfg.logger,
		attempts: attempts.New[string](10000),
		out:      make(chan *delivery, 128), // within the prefetch: the pump converts ahead
		errs:     make(chan error, 1),
	}
	s.ackDelay.Store(int64(ackDelay))
	if s.initial, err = s.dialAndDeclare(ctx); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Queue returns the name of the consumed queue.
func (s *Source) Queue() string { return s.cfg.queue }

// Start implements driver.Source: it starts consuming with a QoS prefetch
// of the Consumer's window (at most AMQP's 65535), logging to the
// Consumer's logger unless WithLogger gave one. A channel holds its
// deliveries until it closes, so there is no lease; the retry queue waits
// out a retry's delay (RetryViaQueue), a requeue does not.
func (s *Source) Start(_ context.Context, st driver.Setup) (driver.Traits, error) {
	if st.Window < 1 {
		return driver.Traits{}, fmt.Errorf("rabbitmq: window %d is below 1", st.Window)
	}
	s.mu.Lock() // Close cancels under s.mu
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return driver.Traits{}, driver.ErrSourceClosed
	}
	s.window = min(st.Window, 65535)
	if s.log == nil {
		s.log = cmp.Or(st.Logger, slog.Default())
	}
	s.wg.Add(1)
	go s.run()
	return driver.Traits{DelaysRetry: s.cfg.retryMode == RetryViaQueue}, nil
}

// RedeliveryHorizon implements driver.RedeliveryHorizoner: twice the
// WithMessageTTL the Source declared its queue and dead-letter queue with,
// or the WithPolicyTTL a policy gives them (a message waits at most that
// long in each), the lower where both are set, as RabbitMQ applies it;
// else unbounded: a queue keeps a message until it is consumed.
func (s *Source) RedeliveryHorizon(context.Context) (time.Duration, bool) {
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
// a queue not yet declared, or as a policy for one that exists (declaring
// it again with message_ttl fails with PRECONDITION_FAILED).
func (s *Source) HorizonHint(retention time.Duration) string {
	ttl := (retention / 2).Truncate(time.Second)
	if ttl <= 0 {
		ttl = retention / 2
	}
	pattern := "^(" + regexp.QuoteMeta(s.cfg.queue) + "|" + regexp.QuoteMeta(s.cfg.deadLetterQueue) + ")$"
	return fmt.Sprintf("give queue %s and its dead-letter queue %s a message TTL of at most %v: for an existing queue, "+
		"rabbitmqctl set_policy idemq-ttl '%s' '{\"message-ttl\":%d}' --apply-to queues, then policy_ttl=%v on the URL; "+
		"for a queue not yet declared, message_ttl=%v on the URL",
		s.cfg.queue, s.cfg.deadLetterQueue, ttl, pattern, ttl.Milliseconds(), ttl, ttl)
}

// Stats returns the Source's counters.
func (s *Source) Stats() Stats {
	return Stats{s.reconnects.Load(), s.stale.Load(), s.multipleAcks.Load(), s.multipleCount.Load(), s.isolations.Load()}
}

// Receive implements driver.Puller: it waits for a delivery and returns
// it with those already waiting, at most max. While the connection is down
// it may return the error of a reconnect attempt.
func (s *Source) Receive(ctx context.Context, max int) ([]*driver.Message, error) {
	if s.ctx.Err() != nil {
		return nil, driver.ErrSourceClosed
	}
	var ms []*driver.Message
	for len(ms) == 0 {
		select {
		case d := <-s.out: // sized for what waits behind it
			ms = d.appendLive(make([]*driver.Message, 0, min(max, len(s.out)+1)))
		case err := <-s.errs:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, driver.ErrSourceClosed
		}
	}
	for len(ms) < max {
		select {
		case d := <-s.out:
			ms = d.appendLive(ms)
		default:
			return ms, nil
		}
	}
	return ms, nil
}

// appendLive appends d's message to ms unless d's channel closed: the
// broker redelivers it, so handing it over would waste a transaction.
func (d *delivery) appendLive(ms []*driver.Message) []*driver.Message {
	if d.sess.ch.IsClosed() {
		return ms
	}
	return append(ms, &d.msg)
}

// Close stops consuming and closes the connection: the broker requeues
// every delivery not settled, and settling one afterwards returns an
// error wrapping driver.ErrStaleDelivery.
func (s *Source) Close() error {
	s.mu.Lock()
	initial := s.initial // run takes it under s.mu once it starts
	s.initial = nil
	s.cancel()
	s.mu.Unlock()
	var err error
	if initial != nil {
		err = initial.Close()
	}
	s.wg.Wait()
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// dialAndDeclare connects and declares (or checks) the topology.
func (s *Source) dialAndDeclare(ctx context.Context) (*amqp.Connection, error) {
	conn, err := s.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: connect: %w", err)
	}
	if err := declare(conn, s.cfg.queue, s.cfg); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// run owns the connection: it starts a session, pumps its deliveries to
// Receive, and when the connection or channel dies reconnects until Close,
// at once to the next node; after a failed round it waits out a backoff
// that starts over once a session runs again.
func (s *Source) run() {
	defer s.wg.Done()
	s.mu.Lock()
	conn := s.initial
	s.initial = nil
	s.mu.Unlock()
	backoff := retry.New(s.cfg.backoffMin, s.cfg.backoffMax)
	for lost := false; s.ctx.Err() == nil; conn = nil {
		sess, deliveries, what, err := s.startSession(conn)
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			wait := backoff.Next()
			s.log.Warn("idemq rabbitmq: "+what+" failed", "queue", s.cfg.queue, "error", err, "retry_in", wait)
			select { // hand err to a waiting Receive, never blocking
			case s.errs <- fmt.Errorf("rabbitmq: %w", err):
			default:
			}
			retry.Sleep(s.ctx, wait)
			continue
		}
		node := s.Last()
		if lost {
			s.reconnects.Add(1)
			s.log.Info("idemq rabbitmq: reconnected", "queue", s.cfg.queue, "node", node, "reconnects", s.reconnects.Load())
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
		sess.flush()
		sess.conn.Close() // and with it the channel: its deliveries go stale
		if s.ctx.Err() != nil {
			return
		}
		lost = true
		s.log.Warn("idemq rabbitmq: connection lost, reconnecting", "queue", s.cfg.queue, "node", node, "reason", reason)
	}
}

// startSession starts consuming on conn, dialled and the topology
// declared first when nil. On failure it closes the connection, and what
// names the step that failed.
func (s *Source) startSession(conn *amqp.Connection) (_ *session, _ <-chan amqp.Delivery, what string, err error) {
	if conn == nil {
		if conn, err = s.dialAndDeclare(s.ctx); err != nil {
			return nil, nil, "reconnect", err
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, "consume", err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	window, tag := s.window, s.cfg.consumerTag
	if s.isolate.Load() {
		window = 1
		// A tag of its own, to cancel this consumer once a message parsed.
		tag = fmt.Sprintf("idemq-isolating-%d", s.isolations.Add(1))
	}
	var deliveries <-chan amqp.Delivery
	if err = ch.Qos(window, 0, false); err == nil {
		deliveries, err = ch.Consume(s.cfg.queue, tag, false, false, false, false, nil)
	}
	if err != nil {
		conn.Close() // and ch with it
		return nil, nil, "consume", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions++
	s.sess = &session{src: s, n: s.sessions, conn: conn, ch: ch, closed: closed, live: map[uint64]struct{}{}, tag: tag}
	return s.sess, deliveries, "", nil
}

// pump registers each delivery's tag as live before handing it to
// Receive, in tag order: a multiple ack relies on every tag below a live
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
				if !sess.isReleased() { // queue deleted, or channel closed: a fresh session re-checks the topology
					return "consumer cancelled or channel closed"
				}
				deliveries = nil // Release stopped consuming; the session stays for the settlements to come
				continue
			}
			if s.isolate.Load() && !sess.isReleased() && s.passedUnparseable(raw.Redelivered) {
				s.isolate.Store(false)
				next, err := s.unisolate(sess)
				if err != nil {
					return "leaving one-at-a-time consumption: " + err.Error()
				}
				deliveries = next
			}
			sess.add(raw.DeliveryTag)
			select {
			case s.out <- s.newDelivery(sess, raw):
			case <-s.ctx.Done():
				return "closed"
			case e := <-sess.closed: // the tag died with it: the broker redelivers
				return closeReason(e)
			}
		}
	}
}

// newDelivery converts raw, received on sess, into a delivery.
func (s *Source) newDelivery(sess *session, raw amqp.Delivery) *delivery {
	d := &delivery{sess: sess, raw: raw}
	toMessage(&d.msg, s.cfg.queue, s.cfg.idHeader, &d.raw)
	d.id, d.msg.AckID, d.msg.Metadata = d.msg.ID, d, (*metadata)(d)
	if d.msg.IDError != nil {
		s.log.Warn("idemq rabbitmq: message without a usable id; the Consumer dead-letters it", "queue", s.cfg.queue, "delivery_tag", raw.DeliveryTag, "error", d.msg.IDError)
	}
	if raw.Redelivered {
		d.msg.Attempt = max(d.msg.Attempt, s.attempts.Last(d.id)+1)
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
	return s.isolatedParsed >= s.window
}

// unparseable tells a connection the client dropped on a frame it could
// not parse from one that was lost or closed.
func unparseable(e *amqp.Error) bool {
	return e != nil && e.Code == amqp.FrameError && !e.Server && !strings.Contains(e.Reason, "EOF") &&
		(strings.Contains(e.Reason, "invalid field") || strings.Contains(e.Reason, "frame could not be parsed") || strings.Contains(e.Reason, "frame size"))
}

// unisolate replaces the session's one-at-a-time consumer by one with the
// full window (a consumer's prefetch is fixed when it starts) and returns
// its deliveries. The old one, cancelled after, holds only the message
// just received, so delivery tags stay in order.
func (s *Source) unisolate(sess *session) (<-chan amqp.Delivery, error) {
	if err := sess.ch.Qos(s.window, 0, false); err != nil {
		return nil, err
	}
	next, err := sess.ch.Consume(s.cfg.queue, s.cfg.consumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	sess.mu.Lock()
	sess.tag = s.cfg.consumerTag
	sess.mu.Unlock()
	return next, sess.ch.Cancel(fmt.Sprintf("idemq-isolating-%d", s.isolations.Load()), false)
}

func closeReason(e *amqp.Error) string {
	if e == nil {
		return "channel closed"
	}
	return e.Error()
}

// dialer dials a URL's nodes in turn (see Open).
type dialer = hostlist.Dialer[*amqp.Connection]

// open dials url, one node's, with cc; ctx can abandon the dial, and a
// connection that arrives too late is closed.
func (cc connConfig) open(ctx context.Context, url string) (*amqp.Connection, error) {
	cfg := amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"}
	if cc.dial != nil {
		cfg = *cc.dial
	}
	if cfg.Properties = maps.Clone(cfg.Properties); cfg.Properties == nil {
		cfg.Properties = amqp.NewConnectionProperties()
	}
	if _, ok := cfg.Properties["connection_name"]; !ok {
		cfg.Properties.SetClientConnectionName(cc.connName)
	}
	if cfg.Dial == nil {
		timeout := 30 * time.Second // amqp091-go's default
		if u, err := amqp.ParseURI(url); err == nil && u.ConnectionTimeout > 0 {
			timeout = time.Duration(u.ConnectionTimeout) * time.Millisecond
		}
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The handshake has no heartbeats; amqp091-go clears this once open.
			return c, c.SetDeadline(time.Now().Add(timeout))
		}
	}
	return hostlist.Await(ctx, func() (*amqp.Connection, error) { return amqp.DialConfig(url, cfg) },
		func(c *amqp.Connection) { c.Close() })
}
