package core

import "context"

// Observer is told about every message's decision, Duplicate and
// DeadLetter included, in the way pgx's tracers are: StartDecision when
// the message is received (after WithIDFunc, before any check) and
// EndDecision with its final Outcome, before the broker is told.
// Tracing, metrics and logging are observers. The Consumer calls an
// Observer from several goroutines at once, but for one message in order.
type Observer interface {
	// StartDecision returns the context the message's decision runs
	// under: its handler and the stages of its batch get it, so a span
	// started here parents their work. Return ctx to add nothing.
	StartDecision(ctx context.Context, m *Message) context.Context
	// EndDecision gets the context StartDecision returned and the
	// message's Outcome.
	EndDecision(ctx context.Context, m *Message, out Outcome)
}

// StageObserver is implemented by Observers that also want the store
// stages of each batch's transaction: StageBegin, StageClaim,
// StageHandlers, StageFlush (only for stores that queue statements and
// send them apart from the commit; Postgres sends them with it) and
// StageCommit. A leased Consumer (NewLeased) adds, per message, StageLease
// (the short transaction that claims it in progress), StageExternal (its
// External call) and StageRelease (giving its lease up after a failure),
// and per completion transaction StageFence between StageClaim and
// StageHandlers.
type StageObserver interface {
	// StartStage returns the context the stage's store call runs under
	// (for StageHandlers: a BatchHandler's context).
	StartStage(ctx context.Context, s Stage) context.Context
	// EndStage gets the context StartStage returned and the stage's
	// error.
	EndStage(ctx context.Context, s Stage, err error)
}

// Stage is one store stage of a batch's transaction, as a StageObserver
// sees it.
type Stage struct {
	// Name is StageBegin, StageClaim, StageFence, StageHandlers, StageFlush
	// or StageCommit, or for one message of a leased Consumer StageLease,
	// StageExternal or StageRelease.
	Name StageName
	// Messages are the messages the transaction decides (for StageHandlers
	// and later stages: those whose claim won), and Contexts their
	// contexts as StartDecision returned them, index for index. The
	// stages of one transaction share them: read, never modify.
	Messages []*Message
	Contexts []context.Context
}

// WithObserver adds observers of every decision, and of every store stage
// for those that implement StageObserver. Start methods are called in the
// order given, end methods in the reverse order, each with the context
// the start method returned. Observing takes no goroutine or hand-off of
// its own: observers run on the Consumer's receive, worker and settling
// goroutines, so an observer that blocks slows the Consumer.
func WithObserver(obs ...Observer) Option {
	return func(c *config) error {
		for i, o := range obs {
			if o == nil {
				return optErr("WithObserver", "observer %d is nil", i)
			}
			c.observers = append(c.observers, o)
			if so, ok := o.(StageObserver); ok {
				c.stageObservers = append(c.stageObservers, so)
			}
		}
		return nil
	}
}

// observed are a message's per-observer contexts when there are several
// observers: observer i's end method gets the context its start returned.
// A slice and not a struct holding one: one allocation per message, not two.
type observed []context.Context

func (c *Consumer[Tx]) startDecision(ctx context.Context, m *Message) (context.Context, observed) {
	switch len(c.cfg.observers) {
	case 0:
		return ctx, nil
	case 1:
		return c.cfg.observers[0].StartDecision(ctx, m), nil
	}
	ob := make(observed, len(c.cfg.observers))
	for i, o := range c.cfg.observers {
		ctx = o.StartDecision(ctx, m)
		ob[i] = ctx
	}
	return ctx, ob
}

func (c *Consumer[Tx]) endDecision(ctx context.Context, ob observed, m *Message, out Outcome) {
	switch len(c.cfg.observers) {
	case 0:
		return
	case 1:
		c.cfg.observers[0].EndDecision(ctx, m, out)
		return
	}
	for i := len(c.cfg.observers) - 1; i >= 0; i-- {
		c.cfg.observers[i].EndDecision(ob[i], m, out)
	}
}

// stageRun is one observed store stage.
type stageRun struct {
	stage Stage
	ctxs  []context.Context // per stage observer, when several
}

// stageOf returns the Stage of the items at idx, nameless, for
// startStage: built once for the stages that share it (begin and claim;
// handlers, flush and commit), and not at all without stage observers.
func (c *Consumer[Tx]) stageOf(items []*item, idx []int) Stage {
	if len(c.cfg.stageObservers) == 0 {
		return Stage{}
	}
	s := Stage{Messages: make([]*Message, len(idx)), Contexts: make([]context.Context, len(idx))}
	for k, i := range idx {
		s.Messages[k] = items[i].m
		s.Contexts[k] = items[i].ctx
	}
	return s
}

// startStage tells the stage observers that stage s, named name, begins
// and returns the context its store call runs under. With no stage
// observer it returns ctx and allocates nothing.
func (c *Consumer[Tx]) startStage(ctx context.Context, name StageName, s Stage) (context.Context, *stageRun) {
	if len(c.cfg.stageObservers) == 0 {
		return ctx, nil
	}
	s.Name = name
	r := &stageRun{stage: s}
	if len(c.cfg.stageObservers) > 1 {
		r.ctxs = make([]context.Context, len(c.cfg.stageObservers))
	}
	for i, o := range c.cfg.stageObservers {
		ctx = o.StartStage(ctx, r.stage)
		if r.ctxs != nil {
			r.ctxs[i] = ctx
		}
	}
	return ctx, r
}

func (c *Consumer[Tx]) endStage(ctx context.Context, r *stageRun, err error) {
	if r == nil {
		return
	}
	for i := len(c.cfg.stageObservers) - 1; i >= 0; i-- {
		sctx := ctx
		if r.ctxs != nil {
			sctx = r.ctxs[i]
		}
		c.cfg.stageObservers[i].EndStage(sctx, r.stage, err)
	}
}

// DecisionFunc is an Observer that is told only each message's end: its
// Outcome. It suits counting or recording decisions.
type DecisionFunc func(ctx context.Context, m *Message, out Outcome)

// StartDecision implements Observer; it returns ctx.
func (f DecisionFunc) StartDecision(ctx context.Context, _ *Message) context.Context { return ctx }

// EndDecision implements Observer by calling f.
func (f DecisionFunc) EndDecision(ctx context.Context, m *Message, out Outcome) { f(ctx, m, out) }

// StageName names a step of a message's decision: the stages a
// StageObserver sees, and the Stage of a DecisionError, which says where a
// Retry or DeadLetter came from.
type StageName string

// The stages. Observers see those of a transaction (StageBegin to
// StageCommit) and of a leased message (StageLease, StageExternal,
// StageRelease); a DecisionError names the one that failed, or one of
// those a message is decided at before or beside any transaction
// (StageID, StageLimits, StageFingerprint, StageHandler, StageSavepoint,
// StageBatch, StageKeyOrder).
const (
	StageID          StageName = "id"          // the message's id is missing or invalid
	StageLimits      StageName = "limits"      // the message is over its Limits
	StageDecode      StageName = "decode"      // the adapter could not read the message whole
	StageBegin       StageName = "begin"       // the transaction begins
	StageClaim       StageName = "claim"       // the ids are claimed
	StageFingerprint StageName = "fingerprint" // the id was claimed with another body
	StageFence       StageName = "fence"       // a leased batch's leases are ended
	StageHandlers    StageName = "handlers"    // the handlers of a transaction run
	StageHandler     StageName = "handler"     // one message's handler failed
	StageSavepoint   StageName = "savepoint"   // a savepoint failed (IsolateSavepoints)
	StageFlush       StageName = "flush"       // queued statements are sent
	StageCommit      StageName = "commit"      // the transaction commits
	StageBatch       StageName = "batch"       // an earlier copy in the same batch was not applied
	StageKeyOrder    StageName = "key-order"   // an earlier message of its key is retried: it goes back behind it
	StageLease       StageName = "lease"       // a leased message's claim is taken in progress
	StageExternal    StageName = "external"    // a leased message's External call runs
	StageRelease     StageName = "release"     // a failed leased message's lease is given up
)
