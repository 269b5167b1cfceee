// Package sqloutbox holds what the SQL outboxes (pgoutbox, mysqloutbox,
// sqliteoutbox) share: the WithTable option, readying messages for their
// rows, the per-key write locks (SQLite, with one writer at a time, needs
// none), the step of a claim that adds the rows following each claimed
// head, the SQL of parked rows and of the operator's queries, and for the
// database/sql ones (mysqloutbox, sqliteoutbox) placeholders, the reading
// of claimed rows, a claim's Finish and the outbox.Operator.
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

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/internal/sqlident"
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

// Prepare is the first step of a store's Write: it refuses a missing
// transaction (noTx), even with no messages, and readies msgs for their
// rows with outbox.Prepare (which gives a message without an id a UUIDv7
// and stores ctx's trace context in the headers). No messages give no
// rows, and Write nothing to do. Its errors name the store's Write and the
// message's index.
func Prepare(ctx context.Context, store string, noTx bool, msgs []*outbox.Message) ([]Row, error) {
	if noTx {
		return nil, fmt.Errorf("%s: Write: nil tx", store)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
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

// WithTable is a store's WithTable option on its config C: name must pass
// sqlident.CheckMax(name, maxLen), or applying the option fails with
// "store: WithTable: " and the reason; set stores the name.
func WithTable[C any](store, name string, maxLen int, set func(*C)) func(*C) error {
	err := sqlident.CheckMax(name, maxLen)
	if err != nil {
		err = fmt.Errorf("%s: WithTable: %w", store, err)
	}
	return option.Check(err, set)
}

// NewRelay is an outbox package's NewRelay: it refuses a nil handle h
// (what names its type in the error) and returns an outbox.Relay that
// publishes through pub the rows of the Store that store makes on h.
func NewRelay[H comparable, S outbox.Store](pkg, what string, h H, store func(H) S, pub driver.Publisher, opts []outbox.Option) (*outbox.Relay, error) {
	var nilHandle H
	if h == nilHandle {
		return nil, fmt.Errorf("%s: NewRelay: nil %s", pkg, what)
	}
	return outbox.NewRelay(store(h), pub, opts...)
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

// Earlier is the condition on p, an earlier row of the same key, that
// keeps a row from being its key's head: a pending row, and with HoldKey
// also a parked one.
func Earlier(p outbox.ParkedKeyPolicy) string {
	if p == outbox.SkipParked {
		return "p.sent_at IS NULL AND p.parked_at IS NULL"
	}
	return "p.sent_at IS NULL"
}

// NotBehindParked is the condition, on a row of table, for a claim's run
// (the rows following a head) under p: with HoldKey a run stops at a
// parked row of its key.
func NotBehindParked(p outbox.ParkedKeyPolicy, table string) string {
	if p == outbox.SkipParked {
		return "1 = 1"
	}
	return fmt.Sprintf(`NOT EXISTS (SELECT 1 FROM %[1]s b WHERE b.ordering_key = %[1]s.ordering_key AND b.sent_at IS NULL AND b.parked_at IS NOT NULL AND b.seq < %[1]s.seq)`, table)
}

// Policies lists the parked-key policies, for stores that prepare a claim
// query for each.
var Policies = []outbox.ParkedKeyPolicy{outbox.HoldKey, outbox.SkipParked}

// Runs is AppendRuns' run for a database/sql outbox claiming in tx under
// policy p: the pending rows of keys, in Seq order, that are not among
// seqs. cols are the columns ScanRows reads.
func Runs(ctx context.Context, tx *sql.Tx, cols, table string, p outbox.ParkedKeyPolicy) func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
	return func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
		q := fmt.Sprintf("SELECT %s FROM %s WHERE ordering_key IN (%s) AND sent_at IS NULL AND parked_at IS NULL AND seq NOT IN (%s) AND %s ORDER BY seq LIMIT ?",
			cols, table, Placeholders(len(keys)), Placeholders(len(seqs)), NotBehindParked(p, table))
		rows, err := tx.QueryContext(ctx, q, append(append(Anys(keys), Anys(seqs)...), room)...)
		if err != nil {
			return nil, err
		}
		return ScanRows(rows)
	}
}

// StatsSQL counts, in table, the parked rows, the keys with pending rows
// behind a parked row, and those rows. It starts from the parked rows,
// which are few, not from the pending ones.
func StatsSQL(table string) string {
	return fmt.Sprintf(`SELECT
	(SELECT COUNT(*) FROM %[1]s WHERE sent_at IS NULL AND parked_at IS NOT NULL),
	COUNT(DISTINCT w.ordering_key), COUNT(w.seq)
FROM (
	SELECT ordering_key, MIN(seq) AS seq FROM %[1]s
	WHERE sent_at IS NULL AND parked_at IS NOT NULL AND ordering_key IS NOT NULL
	GROUP BY ordering_key
) h
JOIN %[1]s w ON w.ordering_key = h.ordering_key AND w.seq > h.seq AND w.sent_at IS NULL AND w.parked_at IS NULL`, table)
}

// Dialect is how an outbox's SQL differs between databases where the
// operator's queries and a claim's Finish need it.
type Dialect struct {
	// Postgres: $n placeholders and arrays, rather than "?" and lists.
	Postgres bool
	// Micros is the SQL of column col as Unix microseconds.
	Micros func(col string) string
	// Length is the SQL function giving a BLOB's length in bytes.
	Length string
	// Now is the SQL of the current time as the time columns hold it,
	// with its arguments; After is the time d from now.
	Now   func() (string, []any)
	After func(d time.Duration) (string, []any)
}

// where is the condition selecting the parked rows of f, with its
// arguments; n is how many arguments precede them.
func (d Dialect) where(f outbox.ParkedFilter, n int) (string, []any) {
	conds := []string{"sent_at IS NULL", "parked_at IS NOT NULL"}
	var args []any
	param := func(v any) string {
		args = append(args, v)
		if d.Postgres {
			return fmt.Sprintf("$%d", n+len(args))
		}
		return "?"
	}
	if len(f.Seqs) > 0 {
		if d.Postgres {
			conds = append(conds, "seq = ANY("+param(f.Seqs)+"::bigint[])")
		} else {
			conds = append(conds, "seq IN ("+Placeholders(len(f.Seqs))+")")
			args = append(args, Anys(f.Seqs)...)
		}
	}
	if f.Key != "" {
		conds = append(conds, "ordering_key = "+param(f.Key))
	}
	if f.Cause != "" {
		if d.Postgres {
			conds = append(conds, "strpos(last_error, "+param(f.Cause)+") > 0")
		} else {
			conds = append(conds, "INSTR(last_error, "+param(f.Cause)+") > 0")
		}
	}
	if !f.ParkedBefore.IsZero() {
		conds = append(conds, d.Micros("parked_at")+" < "+param(f.ParkedBefore.UnixMicro()))
	}
	if !f.ParkedAfter.IsZero() {
		conds = append(conds, d.Micros("parked_at")+" > "+param(f.ParkedAfter.UnixMicro()))
	}
	return strings.Join(conds, " AND "), args
}

// ParkedSQL selects the parked rows of f in table, as ScanParked reads
// them.
func (d Dialect) ParkedSQL(table string, f outbox.ParkedFilter) (string, []any) {
	w, args := d.where(f, 0)
	q := fmt.Sprintf(`SELECT seq, id, destination, COALESCE(ordering_key, ''), attempts, %s, %s, COALESCE(last_error, ''), %s(body)
FROM %s WHERE %s ORDER BY seq`, d.Micros("created_at"), d.Micros("parked_at"), d.Length, table, w)
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	return q, args
}

// RedriveSQL makes the parked rows of f in table pending again.
func (d Dialect) RedriveSQL(table string, f outbox.ParkedFilter) (string, []any) {
	now, args := d.Now()
	w, wargs := d.where(f, len(args))
	return fmt.Sprintf(`UPDATE %s SET parked_at = NULL, last_error = NULL, attempts = 0, available_at = %s WHERE %s`, table, now, w), append(args, wargs...)
}

// PurgeSQL deletes the parked rows of f in table.
func (d Dialect) PurgeSQL(table string, f outbox.ParkedFilter) (string, []any) {
	w, args := d.where(f, 0)
	return fmt.Sprintf(`DELETE FROM %s WHERE %s`, table, w), args
}

// Scanner is what ScanParked reads: *sql.Rows or pgx.Rows.
type Scanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanParked reads the rows of a ParkedSQL query; the caller closes them.
func ScanParked(rows Scanner) ([]outbox.ParkedRow, error) {
	var out []outbox.ParkedRow
	for rows.Next() {
		var r outbox.ParkedRow
		var created, parked int64
		if err := rows.Scan(&r.Seq, &r.ID, &r.Destination, &r.Key, &r.Attempts, &created, &parked, &r.Cause, &r.BodySize); err != nil {
			return nil, err
		}
		r.CreatedAt, r.ParkedAt = time.UnixMicro(created), time.UnixMicro(parked)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Claim finishes a relay's claim in tx: rows (from a query that failed
// with err, if err is not nil) are the heads, each followed by the pending
// rows of its key, up to limit. Nothing to claim returns nil and an error
// returns it, both after rolling tx back.
func (d Dialect) Claim(ctx context.Context, tx *sql.Tx, rows *sql.Rows, err error, cols, table string, limit int, parked outbox.ParkedKeyPolicy) (outbox.Claimed, error) {
	c := &claimed{d: d, tx: tx, table: table}
	if err == nil {
		c.rows, err = ScanRows(rows)
	}
	if err == nil && len(c.rows) > 0 {
		c.rows, err = AppendRuns(c.rows, limit, Runs(ctx, tx, cols, table, parked))
	}
	if err != nil || len(c.rows) == 0 {
		tx.Rollback()
		return nil, err
	}
	return c, nil
}

// claimed is a relay's claim of rows, held by its transaction.
type claimed struct {
	d     Dialect
	tx    *sql.Tx
	table string
	rows  []*outbox.Row
}

func (c *claimed) Rows() []*outbox.Row { return c.rows }

func (c *claimed) Finish(ctx context.Context, o outbox.Outcome) error {
	return c.d.Finish(ctx, c.tx, c.table, o)
}

func (c *claimed) Abort(context.Context) error { return c.tx.Rollback() }

// Finish records o in tx, a database/sql outbox's claim of rows in table,
// and commits; on an error it rolls back.
func (d Dialect) Finish(ctx context.Context, tx *sql.Tx, table string, o outbox.Outcome) error {
	err := d.finish(ctx, tx, table, o)
	if err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (d Dialect) finish(ctx context.Context, tx *sql.Tx, table string, o outbox.Outcome) error {
	if len(o.Sent) > 0 {
		now, args := d.Now()
		q := fmt.Sprintf("UPDATE %s SET sent_at = %s WHERE seq IN (%s)", table, now, Placeholders(len(o.Sent)))
		if o.Delete {
			q, args = fmt.Sprintf("DELETE FROM %s WHERE seq IN (%s)", table, Placeholders(len(o.Sent))), nil
		}
		if _, err := tx.ExecContext(ctx, q, append(args, Anys(o.Sent)...)...); err != nil {
			return err
		}
	}
	for _, f := range o.Failed {
		set, args := d.After(f.RetryAfter)
		set = "available_at = " + set
		if f.Park {
			now, nargs := d.Now()
			set, args = "parked_at = "+now, nargs
		}
		q := fmt.Sprintf("UPDATE %s SET attempts = attempts + 1, last_error = ?, %s WHERE seq IN (%s)", table, set, Placeholders(len(f.Seqs)))
		args = append(append([]any{f.Cause}, args...), Anys(f.Seqs)...)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
	}
	return nil
}

// Operator implements outbox.Operator for a database/sql outbox.
type Operator struct {
	DB      *sql.DB
	Table   string
	Dialect Dialect
	// Pending is the store's Pending.
	Pending func(ctx context.Context) (int64, time.Duration, error)
}

// Parked implements outbox.Operator.
func (o *Operator) Parked(ctx context.Context, f outbox.ParkedFilter) ([]outbox.ParkedRow, error) {
	q, args := o.Dialect.ParkedSQL(o.Table, f)
	rows, err := o.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return ScanParked(rows)
}

// Redrive implements outbox.Operator.
func (o *Operator) Redrive(ctx context.Context, f outbox.ParkedFilter) (int64, error) {
	q, args := o.Dialect.RedriveSQL(o.Table, f)
	return o.exec(ctx, q, args)
}

// Purge implements outbox.Operator.
func (o *Operator) Purge(ctx context.Context, f outbox.ParkedFilter) (int64, error) {
	q, args := o.Dialect.PurgeSQL(o.Table, f)
	return o.exec(ctx, q, args)
}

func (o *Operator) exec(ctx context.Context, q string, args []any) (int64, error) {
	res, err := o.DB.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Stats implements outbox.Operator.
func (o *Operator) Stats(ctx context.Context) (outbox.TableStats, error) {
	var st outbox.TableStats
	var err error
	if st.Pending, st.OldestPending, err = o.Pending(ctx); err != nil {
		return st, err
	}
	err = o.DB.QueryRowContext(ctx, StatsSQL(o.Table)).Scan(&st.Parked, &st.HeldKeys, &st.HeldRows)
	return st, err
}

// Opened is an outbox table opened by URL for operations
// (admin.OpenOutbox): its Operator, its name, and what closes the
// connections the opener made.
type Opened struct {
	outbox.Operator
	Name    string
	CloseDB func() error
}

// Table returns the table's name.
func (o *Opened) Table() string { return o.Name }

// Close closes the connections the opener made.
func (o *Opened) Close() error { return o.CloseDB() }

// OpenTable is an outbox package's admin.OutboxOpener: it names the table
// (def when table is ""), refuses a bad name as admin.ErrBadURL, and opens
// the table's Operator with open, which returns it and what closes its
// connections.
func OpenTable[O any](table, def string, newOutbox func(table string) (O, error), open func(O) (outbox.Operator, func() error, error)) (admin.OutboxTable, error) {
	if table == "" {
		table = def
	}
	ob, err := newOutbox(table)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", admin.ErrBadURL, err)
	}
	op, closeDB, err := open(ob)
	if err != nil {
		return nil, err
	}
	return &Opened{Operator: op, Name: table, CloseDB: closeDB}, nil
}
