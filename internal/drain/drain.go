// Package drain runs a workload on the memory broker to completion through
// Consumers, replacing those whose subscription crashed: how tests run a
// memory-broker workload to its end.
package drain

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
)

// Result sums what Drain's consumers decided.
type Result struct {
	core.Stats
	// Crashes counts consumers that stopped because their subscription
	// crashed and were replaced.
	Crashes int
}

// Drain runs consumers on queue until it has nothing ready, delayed or in
// flight, then stops the last one gracefully. newConsumer builds a consumer
// on the subscription it is given; when a subscription crashes (the
// CrashOnAck fault, or Subscription.Crash) Drain starts a new one, as an
// orchestrator restarts a dead process. It is how tests, examples and the
// quickstart run a workload to completion on the memory broker. Publish
// first: on a queue that is already empty Drain returns at once.
func Drain[Tx any](ctx context.Context, b *memory.Broker, queue string, newConsumer func(*memory.Subscription) (*core.Consumer[Tx], error)) (Result, error) {
	var res Result
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	idle := make(chan error, 1)
	go func() { idle <- b.WaitIdle(waitCtx, queue) }()
	for {
		sub, err := b.Subscribe(queue)
		if err != nil {
			return res, err
		}
		c, err := newConsumer(sub)
		if err != nil {
			sub.Close()
			return res, err
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		var runErr, idleErr error
		finished := false
		select {
		case idleErr = <-idle:
			finished = true
			stop()
			runErr = <-done
		case runErr = <-done:
		}
		stop()
		st := c.Stats()
		res.Received += st.Received
		res.Processed += st.Processed
		res.Duplicates += st.Duplicates
		res.Retried += st.Retried
		res.HeldBack += st.HeldBack
		res.DeadLettered += st.DeadLettered
		res.SettleErrors += st.SettleErrors
		res.Stale += st.Stale
		res.Unsettled += st.Unsettled
		switch {
		case finished && idleErr != nil:
			return res, fmt.Errorf("drain: queue %q not drained: %w", queue, idleErr)
		case finished:
			return res, runErr
		case errors.Is(runErr, memory.ErrCrashed):
			res.Crashes++
		case runErr == nil: // ctx was cancelled
			return res, ctx.Err()
		default:
			return res, runErr
		}
	}
}
