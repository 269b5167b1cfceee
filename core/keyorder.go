package core

import (
	"errors"
	"hash/maphash"
	"sync"
)

// keyOrder keeps each key's messages in order for a source that hands out
// a key's next messages before the earlier ones are settled
// (driver.Traits.KeyOrder), one per worker: each key's messages go to one
// worker (enqueue), which decides its batches in the order they were
// received, so only a retry can put a key out of order: the retried
// message goes back to the source, and each message of its key received
// until the source hands the retried one out again must go back too, to
// follow it. Until the retry is settled those wait here (parked); after,
// they are released at once. The source hands out nothing of the key until
// they are back, then the retried message first: its return ends the hold.
// A delivery released under the hold that comes back before it (the same
// AckID) means the retried message is not coming (its partition moved, and
// its next owner decided it): that ends the hold too.
type keyOrder struct {
	mu   sync.Mutex
	keys map[string]*keyHold
	// failed holds the keys retried in the batch being decided, with the
	// index of the first retried: their later messages in it are not
	// applied (earlier ones replayed are). Only its worker uses it.
	failed map[string]int
}

// keyHold is the hold on one key.
type keyHold struct {
	id      string           // the retried message's: its return ends the hold
	pending int              // retries of the key decided and not yet settled
	parked  []*item          // messages of the key waiting for pending to reach 0
	back    map[any]struct{} // the deliveries (AckIDs) released under the hold
}

// release records that it goes back under h and returns its settlement.
func (h *keyHold) release(it *item) settlement {
	if h.back == nil {
		h.back = map[any]struct{}{}
	}
	h.back[it.M.AckID] = struct{}{}
	return settlement{it: it, out: heldBack(it)}
}

// errHeldBack is the cause of a message given back behind its key's retry.
var errHeldBack = errors.New("an earlier message of its key is retried: it goes back to the broker behind it")

// heldBack is the outcome of a message given back behind its key's retry:
// released, undecided, without spending an attempt.
func heldBack(it *item) Outcome {
	it.heldBack = true
	return Outcome{Decision: Retry, Err: &DecisionError{MessageID: it.m.ID, Stage: StageKeyOrder, Err: errHeldBack}}
}

// admitOrdered returns the items of a batch that may be decided, in
// place: the others are parked or given back. It also starts the batch's
// record of failed keys.
func (c *Consumer[Tx]) admitOrdered(items []*item) []*item {
	o := items[0].order // the worker's
	clear(o.failed)
	o.mu.Lock()
	if len(o.keys) == 0 {
		o.mu.Unlock()
		return items
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
		case it.m.ID == h.id:
			delete(o.keys, it.msg.Key) // the retried message is back, ahead of the rest of its key
			kept = append(kept, it)
		default:
			if _, again := h.back[it.M.AckID]; again {
				delete(o.keys, it.msg.Key) // the retried message is not coming
				kept = append(kept, it)
				continue
			}
			back = append(back, h.release(it))
		}
	}
	o.mu.Unlock()
	if len(back) > 0 {
		c.settleAsync(back)
	}
	return kept
}

// enqueue queues it for a worker: under key order, for the worker of its
// key (keyless ones in turn), so each key's messages are decided in the
// order received.
func (c *Consumer[Tx]) enqueue(it *item) {
	switch {
	case c.orders == nil:
		c.items <- it
	case c.queues == nil:
		it.order = c.orders[0]
		c.items <- it
	default:
		var w int
		if k := it.msg.Key; k != "" {
			w = int(maphash.String(keySeed, k) % uint64(len(c.queues)))
		} else {
			w = int(c.rr.Add(1) % uint32(len(c.queues)))
		}
		it.order = c.orders[w]
		c.queues[w] <- it
	}
}

// keySeed hashes keys to workers.
var keySeed = maphash.MakeSeed()

// failKey notes that items[i] was retried in the batch being decided.
func (c *Consumer[Tx]) failKey(items []*item, i int, out Outcome) {
	if o, k := items[i].order, items[i].msg.Key; o != nil && k != "" && out.Decision == Retry {
		if j, ok := o.failed[k]; !ok || i < j {
			o.failed[k] = i
		}
	}
}

// keyFailed reports whether a message of items[i]'s key before it was
// retried in the batch being decided.
func (c *Consumer[Tx]) keyFailed(items []*item, i int) bool {
	o := items[i].order
	if o == nil || items[i].msg.Key == "" {
		return false
	}
	j, ok := o.failed[items[i].msg.Key]
	return ok && j < i
}

// holdKeys puts a hold on the key of each retry in batch (marking it) before
// the batch is settled.
func (c *Consumer[Tx]) holdKeys(batch []settlement) {
	o := batch[0].it.order // a batch is one worker's
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range batch {
		s := &batch[i]
		if s.it.msg.Key == "" || s.out.Decision != Retry || s.it.heldBack {
			continue
		}
		h := o.keys[s.it.msg.Key]
		if h == nil {
			if o.keys == nil {
				o.keys = map[string]*keyHold{}
			}
			// The key's first retry in the batch: the source hands it out
			// again first.
			h = &keyHold{id: s.it.m.ID}
			o.keys[s.it.msg.Key] = h
		}
		h.pending++
		s.hold = true
	}
}

// settledKeys ends the holds holdKeys put for batch, now settled: the
// messages parked behind a key none of whose retries is pending go back.
func (c *Consumer[Tx]) settledKeys(batch []settlement) {
	var back []settlement
	for _, s := range batch {
		if !s.hold {
			continue
		}
		o := s.it.order
		o.mu.Lock()
		h := o.keys[s.it.msg.Key]
		if h.pending--; h.pending == 0 {
			for _, it := range h.parked {
				back = append(back, h.release(it))
			}
			h.parked = nil
		}
		o.mu.Unlock()
	}
	if len(back) > 0 {
		c.settleAsync(back)
	}
}
