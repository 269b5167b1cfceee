package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/inflight"
)

// Consumer runs the pipeline for one Source and one Store: receive → claim
// in a transaction → handler in the same transaction → commit → settle.
// Create it with New and start it with Run.
type Consumer[Tx any] struct {
	cfg   config
	src   driver.Source
	store driver.Store[Tx]
	// kind is the handler kind the constructor chose: per message (New),
	// per batch (NewBatch) or leased (NewLeased).
	kind kind[Tx]
	log  *slog.Logger

	flow  *inflight.Flow // the source's messages held: window, leases, settlement
	items chan *item     // messages to claim, in receive order, waiting for a worker
	// Settling goroutines (reused: their stacks stay grown) settle what
	// workers decide, a batch each, so one slow or stuck settlement never
	// holds up the others and the workers go straight to the next batch.
	settleIdle chan []settlement
	settleQuit chan struct{} // closed when Run ends: idle goroutines exit
	settlers   sync.WaitGroup

	procCtx    context.Context // cancelled when the shutdown deadline passes
	stopping   context.Context // Run's: done when shutdown begins
	outage     outage
	procCancel context.CancelFunc
	inflight   sync.WaitGroup
	started    atomic.Bool
	// noSavepoints warns once that IsolateSavepoints fell back to replay.
	noSavepoints sync.Once

	stats   counters
	pace    pace       // what the batching rule of several workers reads
	filling sync.Mutex // held by the worker filling a batch from the shared queue
	// orders keep each key's messages in order when the source hands out
	// a key's next messages early (driver.Traits.KeyOrder), one per
	// worker; nil otherwise. With several workers each key goes to one
	// worker's queue (queues), so its messages are decided in order.
	orders []*keyOrder
	queues []chan *item
	rr     atomic.Uint32 // spreads keyless messages over the queues
}

type counters struct {
	received, processed, duplicates, retried, heldBack, deadLettered, settleErrors, stale, unsettled, storeOutages, storeRetries atomic.Int64
}

// Stats are a Consumer's running counts of decisions.
type Stats struct {
	Received     int64 // deliveries received from the source
	Processed    int64 // committed and acknowledged (or ack attempted)
	Duplicates   int64 // claim lost: acknowledged without effect
	Retried      int64 // rolled back and handed back for redelivery
	HeldBack     int64 // handed back undecided behind a retried message of their key, to follow it (driver.Traits.KeyOrder)
	DeadLettered int64 // parked with a cause: counted once the broker confirmed the park
	SettleErrors int64 // settlements that failed for another reason than a stale delivery
	Stale        int64 // settlements refused because the delivery went stale (ErrStaleDelivery)
	Unsettled    int64 // left for redelivery at shutdown
	StoreOutages int64 // times the store stopped answering and the Consumer paused until it did
	StoreRetries int64 // messages whose transaction ran again in place after a store step failed (no delivery spent)
}

// item is one message on its way through a batch: from the flow to a
// worker, then as a settlement to a settling goroutine. It holds room in
// the window until it is settled.
type item struct {
	inflight.Held                 // the source's message, as the flow holds it
	ctx           context.Context // as the observers' StartDecision returned it
	ob            observed
	m             *Message // &msg
	msg           Message  // the handlers' copy of Held.M
	fp            string
	heldBack      bool      // given back behind a retry of its key (keyOrder)
	order         *keyOrder // its worker's, under key order
	// lease is the message's lease under a leased Consumer, from the
	// moment it is won.
	lease *leaseHold
}

type consumerKey struct{}

// ConsumerName returns the name of the Consumer whose pipeline ctx belongs
// to, or "" outside one. Middleware uses it for the
// messaging.consumer.group.name attribute and for logs.
func ConsumerName(ctx context.Context) string {
	name, _ := ctx.Value(consumerKey{}).(string)
	return name
}

// ContextWithConsumerName returns ctx carrying name as ConsumerName reports
// it, for testing handlers and middleware outside a Consumer.
func ContextWithConsumerName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, consumerKey{}, name)
}

// New builds a Consumer that runs h for each message whose claim won, in
// the message's dedup transaction. src is a broker adapter (OpenSource, or
// an adapter's constructor) and store a dedup store (OpenStore, or a
// store's constructor). It fails, naming the option, when an option is
// invalid or WithName is missing.
func New[Tx any](src driver.Source, store driver.Store[Tx], h Handler[Tx], opts ...Option) (*Consumer[Tx], error) {
	if h == nil {
		return nil, errors.New("idemq: New: nil Handler")
	}
	return newConsumer("New", src, store, opts, func(c *Consumer[Tx]) kind[Tx] {
		return &perMessage[Tx]{c: c, h: h, call: func(ctx context.Context, tx Tx, it *item) error { return h(ctx, tx, it.m) }}
	})
}

// NewBatch builds a Consumer that runs h once per batch, with every message
// of the batch whose claim won, for set-based effects. Options as for New;
// WithBatchSize decides how many messages h may get.
func NewBatch[Tx any](src driver.Source, store driver.Store[Tx], h BatchHandler[Tx], opts ...Option) (*Consumer[Tx], error) {
	if h == nil {
		return nil, errors.New("idemq: NewBatch: nil BatchHandler")
	}
	return newConsumer("NewBatch", src, store, opts, func(c *Consumer[Tx]) kind[Tx] { return &batchKind[Tx]{c: c, h: h} })
}

// newConsumer builds the pipeline every kind shares, for the constructor
// named ctor, and its kind with newKind.
func newConsumer[Tx any](ctor string, src driver.Source, store driver.Store[Tx], opts []Option, newKind func(*Consumer[Tx]) kind[Tx]) (*Consumer[Tx], error) {
	if src == nil {
		return nil, errors.New("idemq: " + ctor + ": nil Source")
	}
	if store == nil {
		return nil, errors.New("idemq: " + ctor + ": nil Store")
	}
	_, pull := src.(driver.Puller)
	_, push := src.(driver.Pusher)
	if !pull && !push {
		return nil, fmt.Errorf("idemq: %s: the source %T is neither a driver.Puller nor a driver.Pusher", ctor, src)
	}
	cfg := defaultConfig()
	if err := option.Apply(&cfg, opts...); err != nil {
		return nil, err
	}
	if len(cfg.externalMW) > 0 && ctor != "NewLeased" {
		return nil, optErr("WithExternalMiddleware", "only a leased consumer (NewLeased) has an External call; %s's handler runs inside the transaction: use WithHandlerMiddleware", ctor)
	}
	if cfg.name == "" {
		return nil, errors.New("idemq: option WithName is required: it names the consumer in the dedup key")
	}
	if cfg.window == 0 {
		cfg.window = max(4*cfg.batchSize*cfg.concurrency, 8)
	}
	if cfg.window < cfg.batchSize {
		return nil, optErr("WithWindow", "window %d is smaller than batch size %d: batches could never fill", cfg.window, cfg.batchSize)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	c := &Consumer[Tx]{
		cfg:   cfg,
		src:   src,
		store: store,
		log:   cfg.logger.With("consumer", cfg.name),
		// Each queued item holds room in the window, so sends never block.
		items:      make(chan *item, cfg.window),
		settleIdle: make(chan []settlement),
	}
	c.kind = newKind(c)
	return c, nil
}

// Name returns the consumer name used in the dedup key.
func (c *Consumer[Tx]) Name() string { return c.cfg.name }

// Stats returns the decision counts so far.
func (c *Consumer[Tx]) Stats() Stats {
	return Stats{
		Received:     c.stats.received.Load(),
		Processed:    c.stats.processed.Load(),
		Duplicates:   c.stats.duplicates.Load(),
		Retried:      c.stats.retried.Load(),
		HeldBack:     c.stats.heldBack.Load(),
		DeadLettered: c.stats.deadLettered.Load(),
		SettleErrors: c.stats.settleErrors.Load(),
		Stale:        c.stats.stale.Load(),
		Unsettled:    c.stats.unsettled.Load(),
		StoreOutages: c.stats.storeOutages.Load(),
		StoreRetries: c.stats.storeRetries.Load(),
	}
}

// Run receives and processes messages until ctx is cancelled or the source
// closes. On cancellation it stops receiving, lets messages already received
// finish within the shutdown timeout (then rolls back what is left and
// leaves it unacknowledged), settles everything decided, closes the source
// and returns nil. If the source closes by itself, Run drains the same way
// and returns an error wrapping ErrSourceClosed. With WithStrictRetention,
// a store that keeps claims for less than the broker's redelivery horizon
// makes Run close the source and return an error at once; with
// WithStrictDeliveryLimit, so does a broker that drops a message after
// fewer deliveries than MaxAttempts. Run may be called once.
func (c *Consumer[Tx]) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("idemq: Consumer.Run called twice")
	}
	// A worker decides its batches in receive order, which is what lets a
	// source hand out a key's next messages early.
	inOrder := c.kind.inOrder()
	flow, err := inflight.Start(ctx, c.src, inflight.Config{Window: c.cfg.window, Logger: c.log, Hold: hold, Gate: c.waitStore, KeyOrder: inOrder})
	if err != nil {
		c.src.Close()
		return fmt.Errorf("idemq: starting the source with a window of %d: %w", c.cfg.window, err)
	}
	c.flow = flow
	if flow.Traits().KeyOrder {
		c.orders = make([]*keyOrder, c.cfg.concurrency)
		for i := range c.orders {
			c.orders[i] = &keyOrder{failed: map[string]int{}}
		}
		if c.cfg.concurrency > 1 {
			c.queues = make([]chan *item, c.cfg.concurrency)
			for i := range c.queues {
				c.queues[i] = make(chan *item, c.cfg.window) // never blocks, as items
			}
		}
	}
	if err := c.checkRetention(ctx); err != nil {
		flow.Close(ctx)
		return err
	}
	if err := c.checkDeliveryLimit(ctx); err != nil {
		flow.Close(ctx)
		return err
	}

	c.stopping = ctx
	c.procCtx, c.procCancel = context.WithCancel(context.WithValue(context.WithoutCancel(ctx), consumerKey{}, c.cfg.name))
	defer c.procCancel()

	bctx, stopBackground := context.WithCancel(c.procCtx)
	background := make(chan struct{})
	go func() { defer close(background); c.kind.background(bctx) }()
	defer func() { stopBackground(); <-background }()

	var workers sync.WaitGroup
	quit := make(chan struct{})
	c.settleQuit = make(chan struct{})
	workers.Add(c.cfg.concurrency)
	for i := range c.cfg.concurrency {
		in := c.items
		if c.queues != nil {
			in = c.queues[i]
		}
		go func() { defer workers.Done(); c.worker(in, quit) }()
	}

	var recvErr error
	if _, push := c.src.(driver.Pusher); push {
		recvErr = flow.Serve(ctx, c.admitAll)
	} else {
		recvErr = flow.Pull(ctx, c.admitAll)
	}
	if errors.Is(recvErr, ErrSourceClosed) {
		recvErr = fmt.Errorf("idemq: consumer %s stopped: %w", c.cfg.name, recvErr)
	} else if recvErr != nil && ctx.Err() == nil {
		recvErr = fmt.Errorf("idemq: consumer %s stopped: %w", c.cfg.name, recvErr)
	} else {
		recvErr = nil
	}
	deadline := time.Now().Add(c.cfg.shutdownTimeout)

	// Drain: messages already received finish, within the deadline.
	drained := make(chan struct{})
	go func() { c.inflight.Wait(); close(drained) }()
	timer := time.NewTimer(c.cfg.shutdownTimeout)
	select {
	case <-drained:
		timer.Stop()
	case <-timer.C:
		c.log.Warn("idemq: shutdown deadline passed; rolling back messages still in flight", "timeout", c.cfg.shutdownTimeout)
		c.procCancel()
		<-drained
	}
	close(quit)
	close(c.settleQuit)
	workers.Wait()
	c.settlers.Wait() // inflight drained, so all is settled
	c.closeSource(deadline)
	return recvErr
}

// closeSource gives back what the flow still holds and closes the source,
// waiting for it until deadline (or a moment, when the drain used the
// whole bound): a source can block in Close (a Kafka group join waits out a dead member's
// session), and shutdown must end within the shutdown timeout whatever the
// broker does. Everything decided is settled by then; a Close left to finish
// in the background only leaves the broker to redeliver what it held.
func (c *Consumer[Tx]) closeSource(deadline time.Time) {
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.settleTimeout)
		defer cancel()
		closed <- c.flow.Close(ctx)
	}()
	// What is left of the bound, but a moment at least: a drain that took
	// it all still lets a quick Close requeue and commit what it holds.
	t := time.NewTimer(max(time.Until(deadline), min(time.Second, c.cfg.shutdownTimeout)))
	defer t.Stop()
	select {
	case err := <-closed:
		if err != nil && !errors.Is(err, ErrSourceClosed) {
			c.log.Warn("idemq: closing source", "err", err)
		}
	case <-t.C:
		c.log.Warn("idemq: the source did not close within the shutdown timeout; Run returns and leaves it closing", "timeout", c.cfg.shutdownTimeout)
	}
}

// checkRetention compares the store's retention with the broker's
// redelivery horizon: a claim pruned before the broker stops redelivering
// its message lets that message be applied twice. It warns, or with
// WithStrictRetention returns an error naming both durations.
func (c *Consumer[Tx]) checkRetention(ctx context.Context) error {
	hz, ok := c.src.(driver.RedeliveryHorizoner)
	if !ok {
		return nil
	}
	rt, ok := c.store.(driver.Retentioner)
	if !ok {
		return nil
	}
	horizon, known := hz.RedeliveryHorizon(ctx)
	if !known {
		return nil
	}
	retention := rt.Retention()
	if retention <= 0 || retention >= horizon {
		return nil
	}
	shown := horizon.String()
	if horizon == driver.Unbounded {
		if c.cfg.unboundedHorizon {
			c.log.Info("idemq: the broker sets no age limit on the messages it keeps; accepted (WithUnboundedHorizon)", "retention", retention)
			return nil
		}
		shown = "unbounded (the broker sets no age limit on the messages it keeps)"
	}
	fix := "keep claims longer than the horizon (the store's retention), or bound the broker's"
	if h, ok := c.src.(driver.HorizonHinter); ok {
		if hint := h.HorizonHint(retention); hint != "" {
			fix += ": " + hint
		}
	}
	if horizon == driver.Unbounded {
		fix += "; or accept it with WithUnboundedHorizon when messages never wait that long"
	}
	const why = "a message redelivered after its claim is pruned would be applied twice"
	if c.cfg.strictRetention {
		return fmt.Errorf("idemq: consumer %s: the store keeps claims for %v, less than the broker's redelivery horizon, %s: %s; %s (WithStrictRetention)",
			c.cfg.name, retention, shown, why, fix)
	}
	c.log.Warn("idemq: store retention is shorter than the broker's redelivery horizon: "+why,
		"retention", retention, "redelivery_horizon", shown, "fix", fix)
	return nil
}

// checkDeliveryLimit compares MaxAttempts with the delivery limit of a
// broker that archives or drops a message at its limit: the Consumer
// dead-letters a message whose handler keeps failing on its MaxAttempts-th
// delivery (userFailure), so a limit below MaxAttempts lets the broker drop
// it first, neither applied nor parked; a limit equal to it is enough. It
// warns, or with WithStrictDeliveryLimit returns an error naming both
// numbers.
func (c *Consumer[Tx]) checkDeliveryLimit(ctx context.Context) error {
	dl, ok := c.src.(driver.DeliveryLimiter)
	if !ok {
		return nil
	}
	limit, known := dl.DeliveryLimit(ctx)
	if !known || limit >= c.cfg.maxAttempts {
		return nil
	}
	fix := fmt.Sprintf("lower the Consumer's attempts to WithMaxAttempts(%d) or fewer, or raise the broker's delivery limit to at least %d", limit, c.cfg.maxAttempts)
	if h, ok := c.src.(driver.DeliveryLimitHinter); ok {
		if hint := h.DeliveryLimitHint(c.cfg.maxAttempts); hint != "" {
			fix += ": " + hint
		}
	}
	const why = "the broker would drop a message whose handler keeps failing before the Consumer dead-letters it: neither applied nor parked"
	if c.cfg.strictDeliveryLimit {
		return fmt.Errorf("idemq: consumer %s: the broker stops redelivering a message after %d deliveries, fewer than the Consumer's %d attempts: %s; %s (WithStrictDeliveryLimit)",
			c.cfg.name, limit, c.cfg.maxAttempts, why, fix)
	}
	c.log.Warn("idemq: the broker's delivery limit is lower than the Consumer's MaxAttempts: "+why,
		"delivery_limit", limit, "max_attempts", c.cfg.maxAttempts, "fix", fix)
	return nil
}

// hold makes the item a received message is held in.
func hold(dm *driver.Message) *inflight.Held {
	it := &item{}
	it.M, it.Owner = dm, it
	it.msg = Message{ID: dm.ID, Body: dm.Body, Headers: dm.Headers, Key: dm.Key, Source: dm.Source,
		System: dm.System, Attempt: dm.Attempt, Metadata: dm.Metadata, ReceivedAt: dm.ReceivedAt}
	it.m = &it.msg
	return &it.Held
}

// admitAll admits what one receive returned.
func (c *Consumer[Tx]) admitAll(hs []*inflight.Held) {
	c.stats.received.Add(int64(len(hs)))
	c.pace.arrived.Add(int64(len(hs)))
	c.inflight.Add(len(hs))
	for _, h := range hs {
		c.admit(h.Owner.(*item))
	}
}

// admit starts a message's decision and queues it for a worker, or, when
// its id is missing or invalid, decides it at once: no goroutine, no
// hand-off. It holds room in the window until its settlement frees it.
func (c *Consumer[Tx]) admit(it *item) {
	m := it.m
	var err error
	if c.cfg.idFunc != nil {
		id, ierr := c.cfg.idFunc(m)
		if ierr != nil {
			err = fmt.Errorf("%w: IDFunc: %v", ErrMissingID, ierr)
		} else {
			m.ID = id
			it.M.ID = id // a dead-letter copy carries the derived id
		}
	}
	it.ctx, it.ob = c.startDecision(c.procCtx, m)
	stage := StageID
	if err == nil {
		err = c.validateID(m.ID)
		if err != nil && m.ID == "" {
			err = missingIDCause(it.M, err)
		}
	}
	if err == nil && it.M.Unreadable != nil {
		stage, err = StageDecode, it.M.Unreadable
	}
	if err == nil {
		stage, err = StageLimits, c.checkLimits(m)
	}
	if err != nil {
		out := Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: stage, Err: err}}
		c.settleAsync([]settlement{{it: it, out: out}})
		return
	}
	if c.cfg.fingerprint != nil {
		it.fp = c.cfg.fingerprint(m.Body)
	}
	c.kind.admit(it)
}

// settlement is one decided message.
type settlement struct {
	it   *item
	out  Outcome
	hold bool // a retry holding its key's later messages back (keyOrder)
}

// settleAsync hands one decided batch to an idle settling goroutine, or
// starts one: at most one per batch in flight, so never more than the
// window.
func (c *Consumer[Tx]) settleAsync(batch []settlement) {
	select {
	case c.settleIdle <- batch:
	default:
		c.settlers.Add(1)
		go c.settleLoop(batch, c.settleQuit)
	}
}

// settleLoop ends the decisions of batch (counts, observers), settles
// them, then whatever settleAsync hands it, until quit.
func (c *Consumer[Tx]) settleLoop(batch []settlement, quit <-chan struct{}) {
	defer c.settlers.Done()
	var ss []inflight.Settlement
	rep := &settleReport{log: c.log, stats: &c.stats}
	done := rep.done
	for {
		ss = ss[:0]
		for _, s := range batch {
			c.count(s)
			c.endDecision(s.it.ctx, s.it.ob, s.it.m, s.out)
			ss = append(ss, c.settlement(s))
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.procCtx), c.cfg.settleTimeout)
		rep.begin()
		c.flow.Settle(ctx, ss, done)
		rep.end()
		cancel()
		if c.orders != nil {
			c.settledKeys(batch)
		}
		c.inflight.Add(-len(batch)) // Done for each, at once
		select {
		case batch = <-c.settleIdle:
		case <-quit:
			return
		}
	}
}

// settlement is what the flow is asked to do for s. A Retry caused by
// shutdown gives the message back at once, undecided.
func (c *Consumer[Tx]) settlement(s settlement) inflight.Settlement {
	out := inflight.Settlement{H: &s.it.Held}
	switch s.out.Decision {
	case Processed, Duplicate:
		out.Kind = inflight.Ack
	case DeadLetter:
		out.Kind, out.Cause = inflight.DeadLetter, s.out.Err
	default:
		out.Kind, out.Delay = inflight.Retry, s.out.Delay
		if errors.Is(s.out.Err, ErrShutdown) || c.procCtx.Err() != nil || s.it.heldBack {
			out.Kind, out.Delay = inflight.Release, 0
		}
	}
	return out
}

func (c *Consumer[Tx]) count(s settlement) {
	switch s.out.Decision {
	case Processed:
		c.stats.processed.Add(1)
	case Duplicate:
		c.stats.duplicates.Add(1)
	case Retry:
		if s.it.heldBack {
			c.stats.heldBack.Add(1)
		} else {
			c.stats.retried.Add(1)
		}
	}
	// DeadLetter is counted once the broker parked the message (settle):
	// a park that failed is redelivered and decided again, and would
	// otherwise count once per attempt.
}

// missingIDCause is err, with the adapter's reason (Message.IDError:
// where it looked, or why what it found was unusable) and, when the
// message has a header that looks like an id, the URL parameter that
// reads it.
func missingIDCause(m *driver.Message, err error) error {
	if m.IDError != nil {
		err = fmt.Errorf("%w: %v", ErrMissingID, m.IDError)
	}
	if h := idLikeHeader(m.Headers); h != "" {
		err = fmt.Errorf("%w; it has a header %q: if that holds the id, add id_header=%s to the source URL", err, h, url.QueryEscape(h))
	}
	return err
}

// idLikeHeader returns the first header, in name order, whose name reads
// as a message id (MessageId, message-id, X-Message-ID, Idempotency-Key,
// event_id…), or "".
func idLikeHeader(headers map[string]string) string {
	var found string
	for k, v := range headers {
		if v == "" {
			continue
		}
		n := strings.NewReplacer("-", "", "_", "", ".", "").Replace(strings.ToLower(k))
		n = strings.TrimPrefix(n, "x")
		switch n {
		case "messageid", "msgid", "id", "idempotencykey", "eventid", "deliveryid", "requestid":
			if found == "" || k < found {
				found = k
			}
		}
	}
	return found
}

func (c *Consumer[Tx]) validateID(id string) error {
	if id == "" {
		return ErrMissingID
	}
	if len(id) > c.cfg.limits.IDBytes {
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrInvalidID, len(id), c.cfg.limits.IDBytes)
	}
	return validateIDBytes(id)
}

func (c *Consumer[Tx]) checkLimits(m *Message) error {
	if l := c.cfg.limits.BodyBytes; l > 0 && len(m.Body) > l {
		return fmt.Errorf("%w: body of %d bytes, at most %d", ErrTooLarge, len(m.Body), l)
	}
	if l := c.cfg.limits.Headers; l > 0 && len(m.Headers) > l {
		return fmt.Errorf("%w: %d headers, at most %d", ErrTooLarge, len(m.Headers), l)
	}
	return nil
}

func validateIDBytes(id string) error {
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidID)
	}
	if strings.IndexByte(id, 0) >= 0 {
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidID)
	}
	return nil
}

// worker takes batches of up to batchSize items and decides each in one
// transaction. With no linger a batch is whatever has queued up, taken as
// soon as the worker is free, so batches fill up on their own while it is
// busy and add no latency when idle; with a linger it waits that long (or
// until full) for more. With several workers, a worker holding a part-full
// batch while another batch is being decided waits for the rest when the
// arrival rate says it comes sooner than a batch takes (see fill). Workers
// read the items channel directly, without a batcher goroutine between
// them: one hand-off per message less.
func (c *Consumer[Tx]) worker(in chan *item, quit <-chan struct{}) {
	w := workerState{in: in}
	defer func() {
		if w.timer != nil {
			w.timer.Stop()
		}
	}()
	if in == c.items && c.cfg.concurrency > 1 {
		w.filling = &c.filling
	}
	for {
		batch := c.take(&w, quit)
		if batch == nil {
			return
		}
		start := time.Now()
		c.pace.busy.Add(1)
		c.processBatch(batch, &w.scratch)
		c.pace.busy.Add(-1)
		c.pace.batchTook(time.Since(start))
	}
}

// take waits for the next item of w's queue and fills a batch behind it
// (see fill); nil once quit is closed. Workers sharing one queue fill
// their batches one at a time: several free workers splitting what has
// queued would commit it as that many small transactions.
func (c *Consumer[Tx]) take(w *workerState, quit <-chan struct{}) []*item {
	if w.filling != nil {
		w.filling.Lock()
		defer w.filling.Unlock()
	}
	select {
	case first := <-w.in:
		batch := make([]*item, 1, min(c.cfg.batchSize, cap(w.in)+1))
		batch[0] = first
		return c.fill(batch, w)
	case <-quit:
		return nil
	}
}

// workerState is what a worker keeps between its batches.
type workerState struct {
	in       chan *item  // its queue: c.items, or its own under key order
	filling  *sync.Mutex // c.filling when in is shared, else nil
	timer    *time.Timer
	seen     int64     // c.pace.arrived at the last fill
	seenAt   time.Time // when
	perNanos float64   // recent arrival rate, messages per nanosecond
	scratch  scratch
}

// pace is what the batching rule of several workers reads.
type pace struct {
	arrived atomic.Int64 // messages admitted to the workers
	busy    atomic.Int32 // batches being decided
	took    atomic.Int64 // a recent batch's decision time, ns (moving average)
}

// batchTook folds d into the moving average of batch times.
func (p *pace) batchTook(d time.Duration) {
	old := p.took.Load()
	if old == 0 {
		p.took.Store(int64(d))
		return
	}
	p.took.Store(old - old/4 + int64(d)/4)
}

// fill adds to batch what is queued, up to batchSize. With a linger it
// waits up to that long for the rest. Without one, a worker among several
// waits for the rest only while another batch is being decided, when the
// recent arrival rate brings the rest sooner than a batch's recent
// decision time, and for no longer than that time: a batch committed part
// full while the others are busy would split the backlog into small
// transactions, each paying a commit, while waiting for messages that are
// slow to come would cost the overlap that slow handlers need workers for.
func (c *Consumer[Tx]) fill(batch []*item, w *workerState) []*item {
	for len(batch) < c.cfg.batchSize {
		select {
		case it := <-w.in:
			batch = append(batch, it)
			continue
		default:
		}
		break
	}
	wait := c.cfg.linger
	if wait <= 0 && c.cfg.concurrency > 1 {
		wait = c.fillWait(len(batch), w)
	}
	if wait <= 0 || len(batch) >= c.cfg.batchSize {
		return batch
	}
	if w.timer == nil {
		w.timer = time.NewTimer(wait)
	} else {
		w.timer.Reset(wait)
	}
	for len(batch) < c.cfg.batchSize {
		select {
		case it := <-w.in:
			batch = append(batch, it)
		case <-w.timer.C:
			return batch
		}
	}
	w.timer.Stop()
	return batch
}

// fillWait is how long a worker among several waits to fill a batch of n
// (see fill), 0 for not at all. It measures the arrival rate since its
// last fill.
func (c *Consumer[Tx]) fillWait(n int, w *workerState) time.Duration {
	now, arrived := time.Now(), c.pace.arrived.Load()
	if !w.seenAt.IsZero() {
		if d := now.Sub(w.seenAt); d > 0 {
			rate := float64(arrived-w.seen) / float64(d)
			w.perNanos = (w.perNanos + rate) / 2
		}
	}
	w.seen, w.seenAt = arrived, now
	took := time.Duration(c.pace.took.Load())
	if n >= c.cfg.batchSize || c.pace.busy.Load() == 0 || took <= 0 || w.perNanos <= 0 {
		return 0
	}
	need := time.Duration(float64(c.cfg.batchSize-n) / w.perNanos)
	if need > took {
		return 0
	}
	if q := len(c.queues); q > 1 {
		// Its own queue (key order) fills at its share of the rate.
		need *= time.Duration(q)
	}
	return min(need+need/4, took)
}

// shortID keeps hostile ids from flooding logs.
func shortID(id string) string {
	const limit = 128
	if len(id) <= limit {
		return id
	}
	return id[:limit] + fmt.Sprintf("…(%d bytes)", len(id))
}
