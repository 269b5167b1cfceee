// Package sqloutbox holds what the SQL outboxes (pgoutbox, mysqloutbox,
// sqliteoutbox) share: readying messages for their rows, the per-key write
// locks (SQLite, with one writer at a time, needs none), and the step of a
// claim that adds the rows following each claimed head.
package sqloutbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/idemq/idemq/outbox"
)

// Row is a message readied for an outbox table's row.
type Row struct {
	*outbox.Message
	// Headers are outbox.Prepare's headers as a JSON object.
	Headers string
	// Body is the message's body, empty rather than nil (the column is
	// NOT NULL).
	Body []byte
}

// Prepare readies msgs for their rows with outbox.Prepare (which gives a
// message without an id a UUIDv7 and stores ctx's trace context in the
// headers). Its errors name the store's Write and the message's index.
func Prepare(ctx context.Context, store string, msgs []*outbox.Message) ([]Row, error) {
	rows := make([]Row, len(msgs))
	for i, m := range msgs {
		h, err := outbox.Prepare(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("%s: Write: msgs[%d]: %w", store, i, err)
		}
		js, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("%s: Write: msgs[%d] headers: %w", store, i, err)
		}
		rows[i] = Row{Message: m, Headers: string(js), Body: m.Body}
		if rows[i].Body == nil {
			rows[i].Body = []byte{}
		}
	}
	return rows, nil
}

// LockKeys returns the lock of each ordering key among rows, as lock maps
// it, sorted and without repeats: writers that take them in this order
// cannot deadlock on them within one call.
func LockKeys[T cmp.Ordered](rows []Row, lock func(key string) T) []T {
	var locks []T
	for _, r := range rows {
		if r.Key != "" {
			locks = append(locks, lock(r.Key))
		}
	}
	slices.Sort(locks)
	return slices.Compact(locks)
}

// AppendRuns is the second half of a Store's Claim: it adds to heads, the
// rows the claim locked (in Seq order), the pending rows of the same keys
// that follow them, so that up to limit rows go out in one batch, and
// returns all of them in Seq order. No other relay can claim those rows
// while this claim holds their head's lock. run returns at most room
// pending rows of keys whose seq is not in seqs, in Seq order; it is not
// called when no head has a key or no room is left.
func AppendRuns(heads []*outbox.Row, limit int, run func(keys []string, seqs []int64, room int) ([]*outbox.Row, error)) ([]*outbox.Row, error) {
	room := limit - len(heads)
	if room <= 0 {
		return heads, nil
	}
	byKey := map[string]int64{}
	var keys []string
	seqs := make([]int64, len(heads))
	for i, r := range heads {
		seqs[i] = r.Seq
		if r.Key != "" {
			byKey[r.Key] = r.Seq
			keys = append(keys, r.Key)
		}
	}
	if len(keys) == 0 {
		return heads, nil
	}
	more, err := run(keys, seqs, room)
	if err != nil {
		return nil, err
	}
	for _, r := range more {
		if r.Seq > byKey[r.Key] {
			heads = append(heads, r)
		}
	}
	slices.SortFunc(heads, func(a, b *outbox.Row) int { return cmp.Compare(a.Seq, b.Seq) })
	return heads, nil
}
