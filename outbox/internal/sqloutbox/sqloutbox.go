// Package sqloutbox holds what the SQL outboxes (pgoutbox, mysqloutbox,
// sqliteoutbox) share: readying messages for their rows, the per-key write
// locks (SQLite, with one writer at a time, needs none), the step of a
// claim that adds the rows following each claimed head, and for the
// database/sql ones (mysqloutbox, sqliteoutbox) placeholders and the
// reading of claimed rows.
package sqloutbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

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

// Placeholders is n "?" placeholders, comma-separated, for the outboxes on
// database/sql drivers that take them (MySQL, SQLite).
func Placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// Anys converts xs to the []any of a statement's arguments.
func Anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// ScanRows reads the rows of a database/sql outbox's SELECT of its columns
// (seq, id, destination, key, headers as JSON text, body, created_at in
// Unix microseconds, attempts) and closes them. A body is empty, never
// nil.
func ScanRows(rows *sql.Rows) ([]*outbox.Row, error) {
	defer rows.Close()
	var out []*outbox.Row
	for rows.Next() {
		r := &outbox.Row{}
		var headers string
		var micros int64
		if err := rows.Scan(&r.Seq, &r.ID, &r.Destination, &r.Key, &headers, &r.Body, &micros, &r.Attempts); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(headers), &r.Headers); err != nil {
			return nil, fmt.Errorf("row %d headers: %w", r.Seq, err)
		}
		if r.Body == nil {
			r.Body = []byte{}
		}
		r.CreatedAt = time.UnixMicro(micros)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Runs is AppendRuns' run for a database/sql outbox claiming in tx: the
// pending rows of keys, in Seq order, that are not among seqs. cols are
// the columns ScanRows reads.
func Runs(ctx context.Context, tx *sql.Tx, cols, table string) func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
	return func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
		q := fmt.Sprintf("SELECT %s FROM %s WHERE ordering_key IN (%s) AND sent_at IS NULL AND seq NOT IN (%s) ORDER BY seq LIMIT ?",
			cols, table, Placeholders(len(keys)), Placeholders(len(seqs)))
		rows, err := tx.QueryContext(ctx, q, append(append(Anys(keys), Anys(seqs)...), room)...)
		if err != nil {
			return nil, err
		}
		return ScanRows(rows)
	}
}
