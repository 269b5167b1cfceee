package core

import (
	"errors"
	"sync"
)

// keyOrder keeps each key's messages in order for a source that hands out
// a key's next messages before the earlier ones are settled
// (driver.Traits.KeyOrder). One worker decides batches in the order they
// were received, so only a retry can put a key out of order: the retried
// message goes back to the source, and each message of its key received
// before the source took it back must go back too, behind it. Until the
// retry is settled those wait here (parked); after, they are released at
// once. A message received by a later Receive call lifts the hold: the
// source hands out the retried message before it.
type keyOrder struct {
	mu   sync.Mutex
	keys map[string]*keyHold
	// failed holds the keys retried in the batch being decided: their
	// later messages in it are not applied. Only the one worker uses it.
	failed map[string]bool
}

// keyHold is the hold on one key.
type keyHold struct {
	pending int     // retries of the key decided and not yet settled
	until   uint64  // receives up to this one started before the last retry was settled
	parked  []*item // messages of the key waiting for pending to reach 0
}

// errHeldBack is the cause of a message given back behind its key's retry.
var errHeldBack = errors.New("an earlier message of its key is retried: it goes back to the broker behind it")

// heldBack is the outcome of a message given back behind its key's retry:
// released, undecided, without spending an attempt.
func heldBack(it *item) Outcome {
	it.heldBack = true
	return Outcome{Decision: Retry, Err: &DecisionError{MessageID: it.m.ID, Stage: StageKeyOrder, Err: errHeldBack}}
}

// admit returns the items of a batch that may be decided, in place: the
// others are parked or given back. It also starts the batch's record of
// failed keys.
func (c *Consumer[Tx]) admitOrdered(items []*item) []*item {
	o := c.order
	clear(o.failed)
	o.mu.Lock()
	if len(o.keys) == 0 {
		o.mu.Unlock()
		return items
	}
	for k, h := range o.keys {
		// Every later item comes from a later receive: the hold is over.
		if h.pending == 0 && h.until < items[0].Seq {
			delete(o.keys, k)
		}
	}
	var back []settlement
	kept := items[:0]
	for _, it := range items {
		h := o.keys[it.msg.Key]
		switch {
		case it.msg.Key == "" || h == nil:
			kept = append(kept, it)
		case h.pending > 0:
			h.parked = append(h.parked, it)
		case it.Seq <= h.until:
			back = append(back, settlement{it: it, out: heldBack(it)})
		default:
			delete(o.keys, it.msg.Key)
			kept = append(kept, it)
		}
	}
	o.mu.Unlock()
	if len(back) > 0 {
		c.settleAsync(back)
	}
	return kept
}

// failKey notes that it was retried in the batch being decided.
func (c *Consumer[Tx]) failKey(it *item, out Outcome) {
	if c.order != nil && it.msg.Key != "" && out.Decision == Retry {
		c.order.failed[it.msg.Key] = true
	}
}

// keyFailed reports whether an earlier message of it's key was retried in
// the batch being decided.
func (c *Consumer[Tx]) keyFailed(it *item) bool {
	return c.order != nil && it.msg.Key != "" && c.order.failed[it.msg.Key]
}

// holdKeys puts a hold on the key of each retry in batch (marking it) before
// the batch is settled.
func (c *Consumer[Tx]) holdKeys(batch []settlement) {
	o := c.order
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range batch {
		s := &batch[i]
		if s.it.msg.Key == "" || s.out.Decision != Retry || errors.Is(s.out.Err, errHeldBack) {
			continue
		}
		h := o.keys[s.it.msg.Key]
		if h == nil {
			if o.keys == nil {
				o.keys = map[string]*keyHold{}
			}
			h = &keyHold{}
			o.keys[s.it.msg.Key] = h
		}
		h.pending++
		s.hold = true
	}
}

// settledKeys ends the holds holdKeys put for batch, now settled: the
// messages parked behind a key none of whose retries is pending go back.
func (c *Consumer[Tx]) settledKeys(batch []settlement) {
	o := c.order
	seq := c.flow.Received()
	var back []settlement
	o.mu.Lock()
	for _, s := range batch {
		if !s.hold {
			continue
		}
		h := o.keys[s.it.msg.Key]
		h.pending--
		h.until = max(h.until, seq)
		if h.pending == 0 {
			for _, it := range h.parked {
				back = append(back, settlement{it: it, out: heldBack(it)})
			}
			h.parked = nil
		}
	}
	o.mu.Unlock()
	if len(back) > 0 {
		c.settleAsync(back)
	}
}
