package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Consumer runs the pipeline for one Source and one Store: receive → claim
// in a transaction → handler in the same transaction → commit → settle.
// Create it with New and start it with Run.
type Consumer[Tx any] struct {
	cfg     config
	src     Source
	store   Store[Tx]
	handler Handler[Tx]
	// batchHandler replaces handler for consumers made by NewBatch.
	batchHandler BatchHandler[Tx]
	log          *slog.Logger
	process      ProcessFunc

	slots chan struct{} // in-flight window
	// idle hands a delivery to a handling goroutine that finished its
	// last one. Reusing goroutines keeps their grown stacks: a fresh
	// goroutine per delivery spent about a tenth of the consumer's CPU
	// copying its stack as the middleware chain and hashing grew it.
	idle     chan delivery
	handlers sync.WaitGroup
	// direct: with no decision middleware nothing needs a goroutine per
	// message; receiveLoop queues items itself and settling goroutines
	// (reused like the handling ones) settle what workers decide, a batch
	// each, so one slow or stuck settlement never holds up the others.
	direct     bool
	settleIdle chan []settlement
	settleQuit chan struct{} // closed when Run ends: idle goroutines exit
	settlers   sync.WaitGroup
	items      chan *item // messages to claim, in receive order, waiting for a worker

	procCtx    context.Context // cancelled when the shutdown deadline passes
	procCancel context.CancelFunc
	inflight   sync.WaitGroup
	started    atomic.Bool

	stats counters
}

type counters struct {
	received, processed, duplicates, retried, deadLettered, settleErrors, stale, unsettled atomic.Int64
}

// Stats are a Consumer's running counts of decisions.
type Stats struct {
	Received     int64 // deliveries received from the source
	Processed    int64 // committed and acknowledged (or ack attempted)
	Duplicates   int64 // claim lost: acknowledged without effect
	Retried      int64 // rolled back and handed back for redelivery
	DeadLettered int64 // parked with a cause
	SettleErrors int64 // settlements that failed for another reason than a stale delivery
	Stale        int64 // settlements refused because the delivery went stale (ErrStaleDelivery)
	Unsettled    int64 // left for redelivery at shutdown
}

// item is one message on its way through a batch.
type item struct {
	ctx   context.Context
	m     *Message
	fp    string
	state *msgState
	done  chan Outcome
	// d is set on the direct path (no decision middleware): the worker
	// hands the outcome to the settler instead of a waiting goroutine.
	d Delivery
}

// msgState travels in the message's context from the delivery goroutine to
// the innermost ProcessFunc.
type msgState struct {
	d     Delivery
	idErr error
	batch *batchSettlement
	// prev is closed once the previous delivery has entered a batch (or
	// left the pipeline); passed is this one's. They keep batches in
	// receive order although each delivery runs on its own goroutine.
	prev, passed chan struct{}
	hasPassed    bool
}

type stateKey struct{}

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

// New builds a Consumer that runs h for each message whose claim won. It
// fails, naming the option, when an option is invalid or WithName is
// missing.
func New[Tx any](src Source, store Store[Tx], h Handler[Tx], opts ...Option) (*Consumer[Tx], error) {
	if h == nil {
		return nil, errors.New("idemq: New: nil Handler")
	}
	return newConsumer(src, store, h, nil, opts)
}

// NewBatch builds a Consumer that runs h once per batch, with every message
// of the batch whose claim won, for set-based effects. Options as for New;
// WithBatchSize decides how many messages h may get.
func NewBatch[Tx any](src Source, store Store[Tx], h BatchHandler[Tx], opts ...Option) (*Consumer[Tx], error) {
	if h == nil {
		return nil, errors.New("idemq: NewBatch: nil BatchHandler")
	}
	return newConsumer(src, store, nil, h, opts)
}

func newConsumer[Tx any](src Source, store Store[Tx], h Handler[Tx], bh BatchHandler[Tx], opts []Option) (*Consumer[Tx], error) {
	if src == nil {
		return nil, errors.New("idemq: New: nil Source")
	}
	if store == nil {
		return nil, errors.New("idemq: New: nil Store")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
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
		cfg:          cfg,
		src:          src,
		store:        store,
		handler:      h,
		batchHandler: bh,
		log:          cfg.logger.With("consumer", cfg.name),
		slots:        make(chan struct{}, cfg.window),
		idle:         make(chan delivery),
		// Each queued item holds a window slot, so sends never block.
		items: make(chan *item, cfg.window),
	}
	c.process = chainMiddleware(cfg.middleware, c.decide)
	if len(cfg.middleware) == 0 {
		c.direct = true
		c.settleIdle = make(chan []settlement)
	}
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
		DeadLettered: c.stats.deadLettered.Load(),
		SettleErrors: c.stats.settleErrors.Load(),
		Stale:        c.stats.stale.Load(),
		Unsettled:    c.stats.unsettled.Load(),
	}
}

// Run receives and processes messages until ctx is cancelled or the source
// closes. On cancellation it stops receiving, lets messages already received
// finish within the shutdown timeout (then rolls back what is left and
// leaves it unacknowledged), settles everything decided, closes the source
// and returns nil. If the source closes by itself, Run drains the same way
// and returns an error wrapping ErrSourceClosed. Run may be called once.
func (c *Consumer[Tx]) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("idemq: Consumer.Run called twice")
	}
	if ws, ok := c.src.(WindowSetter); ok {
		if err := ws.SetWindow(c.cfg.window); err != nil {
			return fmt.Errorf("idemq: setting the source's window to %d: %w", c.cfg.window, err)
		}
	}
	c.checkRetention(ctx)

	c.procCtx, c.procCancel = context.WithCancel(context.WithValue(context.WithoutCancel(ctx), consumerKey{}, c.cfg.name))
	defer c.procCancel()

	var workers sync.WaitGroup
	quit := make(chan struct{})
	handlersQuit := make(chan struct{})
	c.settleQuit = handlersQuit
	workers.Add(c.cfg.concurrency)
	for range c.cfg.concurrency {
		go func() { defer workers.Done(); c.worker(quit) }()
	}

	recvErr := c.receiveLoop(ctx, handlersQuit)

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
	close(handlersQuit)
	workers.Wait()
	c.handlers.Wait()
	c.settlers.Wait() // handlersQuit ended them: inflight drained, so all settled
	closeErr := c.src.Close()
	if closeErr != nil && !errors.Is(closeErr, ErrSourceClosed) {
		c.log.Warn("idemq: closing source", "err", closeErr)
	}
	return recvErr
}

func (c *Consumer[Tx]) checkRetention(ctx context.Context) {
	hz, ok := c.src.(RedeliveryHorizoner)
	if !ok {
		return
	}
	rt, ok := c.store.(Retentioner)
	if !ok {
		return
	}
	horizon, known := hz.RedeliveryHorizon(ctx)
	if !known {
		return
	}
	if retention := rt.Retention(); retention > 0 && retention < horizon {
		c.log.Warn("idemq: store retention is shorter than the broker's redelivery horizon: a message redelivered after its claim is pruned would be applied twice",
			"retention", retention, "redelivery_horizon", horizon)
	}
}

// receiveLoop takes a window slot, then a delivery, until ctx ends or the
// source closes.
func (c *Consumer[Tx]) receiveLoop(ctx context.Context, quit <-chan struct{}) error {
	failures := 0
	prev := make(chan struct{})
	close(prev)
	for {
		select {
		case c.slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		d, err := c.src.Receive(ctx)
		if err != nil {
			<-c.slots
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrSourceClosed) {
				return fmt.Errorf("idemq: consumer %s stopped: %w", c.cfg.name, err)
			}
			failures++
			delay := ExponentialBackoff{Initial: 50 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}.Delay(failures)
			c.log.Warn("idemq: receive failed; trying again", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		failures = 0
		c.stats.received.Add(1)
		c.inflight.Add(1)
		if c.direct {
			c.enqueueDirect(d)
			continue
		}
		passed := make(chan struct{})
		job := delivery{d: d, prev: prev, passed: passed}
		select {
		case c.idle <- job:
		default:
			c.handlers.Add(1)
			go c.handleLoop(job, quit)
		}
		prev = passed
	}
}

// pass lets the next delivery enter a batch, after waiting for the previous
// one to do so: batches are filled in receive order. Shutdown stops the
// wait, as order no longer matters then.
func (c *Consumer[Tx]) pass(st *msgState, enter func()) {
	if st.hasPassed {
		return
	}
	select {
	case <-st.prev:
	case <-c.procCtx.Done():
	}
	if enter != nil {
		enter()
	}
	st.hasPassed = true
	close(st.passed)
}

// enqueueDirect puts a delivery straight into the item queue (direct
// path): no goroutine, no context, no hand-offs. It owns a window slot
// until the settler releases it.
func (c *Consumer[Tx]) enqueueDirect(d Delivery) {
	m := d.Message()
	var err error
	if c.cfg.idFunc != nil {
		id, ierr := c.cfg.idFunc(m)
		if ierr != nil {
			err = fmt.Errorf("%w: IDFunc: %v", ErrMissingID, ierr)
		} else {
			m.ID = id
		}
	}
	if err == nil {
		err = c.validateID(m.ID)
	}
	if err != nil {
		out := Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: "id", Err: err}}
		c.count(out)
		c.settleAsync([]settlement{{d: d, out: out}})
		return
	}
	it := &item{ctx: c.procCtx, m: m, d: d}
	if c.cfg.fingerprint != nil {
		it.fp = c.cfg.fingerprint(m.Body)
	}
	c.items <- it // capacity window: never blocks
}

// settlement is one decided message of the direct path.
type settlement struct {
	d   Delivery
	out Outcome
}

// settleAsync hands one decided batch of the direct path to an idle
// settling goroutine, or starts one: at most one per batch in flight, so
// never more than the window.
func (c *Consumer[Tx]) settleAsync(batch []settlement) {
	select {
	case c.settleIdle <- batch:
	default:
		c.settlers.Add(1)
		go c.settleLoop(batch, c.settleQuit)
	}
}

// settleLoop settles batch, then whatever settleAsync hands it, until
// quit.
func (c *Consumer[Tx]) settleLoop(batch []settlement, quit <-chan struct{}) {
	defer c.settlers.Done()
	var acks []Delivery
	var others []settleReq
	for {
		acks, others = acks[:0], others[:0]
		for _, s := range batch {
			if s.out.Decision == Processed || s.out.Decision == Duplicate {
				acks = append(acks, s.d)
			} else {
				others = append(others, settleReq{s.d, s.out})
			}
		}
		c.settleBatch(acks, others)
		for range batch {
			<-c.slots
			c.inflight.Done()
		}
		select {
		case batch = <-c.settleIdle:
		case <-quit:
			return
		}
	}
}

// delivery is one received message on its way to a handling goroutine,
// with the channels that keep batches in receive order.
type delivery struct {
	d            Delivery
	prev, passed chan struct{}
}

// handleLoop handles job, then whatever receiveLoop hands it through idle,
// until quit. There are never more of these goroutines than window slots,
// as each delivery holds one.
func (c *Consumer[Tx]) handleLoop(job delivery, quit <-chan struct{}) {
	defer c.handlers.Done()
	for {
		c.handleDelivery(job.d, job.prev, job.passed)
		select {
		case job = <-c.idle:
		case <-quit:
			return
		}
	}
}

// handleDelivery runs one message through the middleware chain and settles
// it. It owns one window slot.
func (c *Consumer[Tx]) handleDelivery(d Delivery, prev, passed chan struct{}) {
	defer c.inflight.Done()
	defer func() { <-c.slots }()
	m := d.Message()
	st := &msgState{d: d, prev: prev, passed: passed}
	if c.cfg.idFunc != nil {
		id, err := c.cfg.idFunc(m)
		if err != nil {
			st.idErr = fmt.Errorf("%w: IDFunc: %v", ErrMissingID, err)
		} else {
			m.ID = id
		}
	}
	ctx := context.WithValue(c.procCtx, stateKey{}, st)
	out := c.process(ctx, m)
	c.pass(st, nil) // in case the message never reached a batch
	if out.Decision < Processed || out.Decision > DeadLetter {
		out = Outcome{Decision: Retry, Err: fmt.Errorf("idemq: middleware returned no decision (%v)", out.Err), Delay: c.cfg.backoff.Delay(m.Attempt)}
	}
	c.count(out)
	if st.batch != nil {
		st.batch.report(c, st, out)
		return
	}
	c.settle(d, out)
}

func (c *Consumer[Tx]) count(out Outcome) {
	switch out.Decision {
	case Processed:
		c.stats.processed.Add(1)
	case Duplicate:
		c.stats.duplicates.Add(1)
	case Retry:
		c.stats.retried.Add(1)
	case DeadLetter:
		c.stats.deadLettered.Add(1)
	}
}

// settle hands one decided message back to the broker. A Retry caused by
// shutdown is not settled: the source's Close leaves it to the broker.
func (c *Consumer[Tx]) settle(d Delivery, out Outcome) {
	if out.Decision == Retry && (errors.Is(out.Err, ErrShutdown) || c.procCtx.Err() != nil) {
		c.stats.unsettled.Add(1)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.procCtx), c.cfg.settleTimeout)
	defer cancel()
	var err error
	switch out.Decision {
	case Processed, Duplicate:
		err = d.Ack(ctx)
	case Retry:
		err = d.Retry(ctx, out.Delay)
	case DeadLetter:
		err = d.DeadLetter(ctx, out.Err)
	}
	if err != nil {
		c.settleFailed(d, out, err)
	}
}

func (c *Consumer[Tx]) settleFailed(d Delivery, out Outcome, err error) {
	// Safe by design: an unsettled message is redelivered, and a committed
	// one then loses its claim and is acknowledged as a Duplicate.
	if errors.Is(err, ErrStaleDelivery) {
		c.stats.stale.Add(1)
		c.log.Info("idemq: delivery went stale before settling; the broker will redeliver", "id", shortID(d.Message().ID), "decision", out.Decision.String(), "err", err)
		return
	}
	c.stats.settleErrors.Add(1)
	c.log.Warn("idemq: settling failed; the broker will redeliver", "id", shortID(d.Message().ID), "decision", out.Decision.String(), "err", err)
}

// batchSettlement collects the final outcomes of one batch's messages so
// that their acks go to the broker in one call.
type batchSettlement struct {
	mu       sync.Mutex
	pending  int
	acks     []Delivery
	others   []settleReq
	finished chan struct{}
}

type settleReq struct {
	d   Delivery
	out Outcome
}

func (b *batchSettlement) report(c consumerSettler, st *msgState, out Outcome) {
	b.mu.Lock()
	if out.Decision == Processed || out.Decision == Duplicate {
		b.acks = append(b.acks, st.d)
	} else {
		b.others = append(b.others, settleReq{st.d, out})
	}
	b.pending--
	last := b.pending == 0
	b.mu.Unlock()
	if !last {
		<-b.finished // hold the window slot until the batch is settled
		return
	}
	c.settleBatch(b.acks, b.others)
	close(b.finished)
}

type consumerSettler interface {
	settleBatch(acks []Delivery, others []settleReq)
}

func (c *Consumer[Tx]) settleBatch(acks []Delivery, others []settleReq) {
	for _, r := range others {
		c.settle(r.d, r.out)
	}
	if len(acks) == 0 {
		return
	}
	bs, ok := c.src.(BatchSettler)
	if !ok || len(acks) == 1 {
		for _, d := range acks {
			c.settle(d, Outcome{Decision: Processed})
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.procCtx), c.cfg.settleTimeout)
	defer cancel()
	if err := bs.AckBatch(ctx, acks); err != nil {
		if errors.Is(err, ErrStaleDelivery) {
			c.stats.stale.Add(1)
		} else {
			c.stats.settleErrors.Add(1)
		}
		c.log.Warn("idemq: batch ack failed; the broker will redeliver and the store will decide Duplicate", "messages", len(acks), "err", err)
	}
}

// decide is the innermost ProcessFunc: it validates the id, then hands the
// message to a batch and waits for the batch's decision.
func (c *Consumer[Tx]) decide(ctx context.Context, m *Message) Outcome {
	st, _ := ctx.Value(stateKey{}).(*msgState)
	if st == nil {
		return Outcome{Decision: Retry, Err: errors.New("idemq: ProcessFunc called outside the Consumer's pipeline")}
	}
	if st.idErr != nil {
		c.pass(st, nil)
		return Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: "id", Err: st.idErr}}
	}
	if err := c.validateID(m.ID); err != nil {
		c.pass(st, nil)
		return Outcome{Decision: DeadLetter, Err: &DecisionError{MessageID: m.ID, Stage: "id", Err: err}}
	}
	it := &item{ctx: ctx, m: m, state: st, done: make(chan Outcome, 1)}
	if c.cfg.fingerprint != nil {
		it.fp = c.cfg.fingerprint(m.Body)
	}
	entered := false
	c.pass(st, func() {
		select {
		case c.items <- it:
			entered = true
		case <-c.procCtx.Done():
		}
	})
	if !entered {
		return Outcome{Decision: Retry, Err: &DecisionError{MessageID: m.ID, Stage: "shutdown", Err: ErrShutdown}}
	}
	return <-it.done
}

func (c *Consumer[Tx]) validateID(id string) error {
	if id == "" {
		return ErrMissingID
	}
	if len(id) > c.cfg.maxIDLength {
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrInvalidID, len(id), c.cfg.maxIDLength)
	}
	return validateIDBytes(id)
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
// until full) for more. Workers read the items channel directly, without
// a batcher goroutine between them: one hand-off per message less.
func (c *Consumer[Tx]) worker(quit <-chan struct{}) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var first *item
		select {
		case first = <-c.items:
		case <-quit:
			return
		}
		batch := make([]*item, 1, min(c.cfg.batchSize, cap(c.items)+1))
		batch[0] = first
		batch = c.fill(batch, &timer)
		c.processBatch(batch)
	}
}

// fill adds to batch what is queued, up to batchSize, and with a linger
// waits up to that long for the rest.
func (c *Consumer[Tx]) fill(batch []*item, timer **time.Timer) []*item {
	for len(batch) < c.cfg.batchSize {
		select {
		case it := <-c.items:
			batch = append(batch, it)
			continue
		default:
		}
		break
	}
	if c.cfg.linger <= 0 || len(batch) >= c.cfg.batchSize {
		return batch
	}
	if *timer == nil {
		*timer = time.NewTimer(c.cfg.linger)
	} else {
		(*timer).Reset(c.cfg.linger)
	}
	for len(batch) < c.cfg.batchSize {
		select {
		case it := <-c.items:
			batch = append(batch, it)
		case <-(*timer).C:
			return batch
		}
	}
	(*timer).Stop()
	return batch
}

// shortID keeps hostile ids from flooding logs.
func shortID(id string) string {
	const limit = 128
	if len(id) <= limit {
		return id
	}
	return id[:limit] + fmt.Sprintf("…(%d bytes)", len(id))
}
