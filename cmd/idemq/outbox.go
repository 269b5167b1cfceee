package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/units"
	"github.com/idemq/idemq/outbox"
)

const outboxUsage = `Usage: idemq outbox <list|redrive|purge|stats> --store URL [flags]

Operates a transactional outbox table (outbox/pgoutbox, mysqloutbox,
sqliteoutbox). A row whose publish failed too often (the relay's
WithMaxAttempts), or once with an answer the broker's publisher marks
permanent, is parked with the error of its last publish, its cause:
no relay publishes it, and with the relay's default (HoldKey) the later
rows of its ordering key wait behind it.

  list     show the parked rows
  redrive  make parked rows pending again, to be published at once
  purge    delete parked rows, so they are never published (needs --yes)
  stats    pending rows, the oldest one's age, parked rows, keys held back

The store URL is postgres://…, mysql://… or sqlite://path; ?table= or
--table names the outbox table (default outbox). Credentials never
appear in the output. Run 'idemq outbox <command> --help' for its flags.
`

// outboxCommands are the subcommands of idemq outbox.
func outboxCommands() []command {
	return []command{
		{"list", "", runOutboxList},
		{"redrive", "", runOutboxRedrive},
		{"purge", "", runOutboxPurge},
		{"stats", "", runOutboxStats},
	}
}

func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, "outbox", outboxUsage, outboxCommands(), args, stdout, stderr)
}

// outboxFlags are the flags every outbox command has, and the selection
// of parked rows of those that take one.
type outboxFlags struct {
	*cli.Flags
	storeURL func() (string, error)
	table    *string
	ids      rowList
	key      *string
	cause    *string
	older    *time.Duration
	newer    *time.Duration
}

func newOutboxFlags(name, usage string, stdout io.Writer, selects bool) *outboxFlags {
	f := &outboxFlags{Flags: cli.NewFlags("idemq outbox "+name, usage, stdout)}
	f.storeURL = f.StoreFlag()
	f.table = f.String("table", "", "the outbox table (default: the URL's ?table=, else outbox)")
	if selects {
		f.Var(&f.ids, "id", "a parked row's number (ROW in list), repeatable or comma-separated; row numbers may also follow the flags")
		f.key = f.String("key", "", "only rows of this ordering key")
		f.cause = f.String("cause", "", "only rows whose cause contains this text")
		f.older = f.Duration("older-than", 0, "only rows parked longer ago than this (for example 1h)")
		f.newer = f.Duration("newer-than", 0, "only rows parked less long ago than this")
	}
	return f
}

// parse parses args and returns the store URL and, for commands that
// select parked rows, the filter (row numbers from --id and the
// arguments).
func (f *outboxFlags) parse(args []string) (string, outbox.ParkedFilter, error) {
	var filter outbox.ParkedFilter
	var rest []string
	var err error
	if f.key != nil {
		rest, err = parseIDs(f.Flags, args)
	} else {
		err = f.Parse(args)
	}
	if err != nil {
		return "", filter, err
	}
	raw, err := f.storeURL()
	if err != nil {
		return "", filter, err
	}
	for _, a := range rest {
		if err := f.ids.Set(a); err != nil {
			return "", filter, cli.Usagef("%v", err)
		}
	}
	if f.key != nil {
		if *f.older < 0 || *f.newer < 0 {
			return "", filter, cli.Usagef("--older-than and --newer-than must be positive")
		}
		filter = outbox.ParkedFilter{Seqs: f.ids, Key: *f.key, Cause: *f.cause}
		now := time.Now()
		if *f.older > 0 {
			filter.ParkedBefore = now.Add(-*f.older)
		}
		if *f.newer > 0 {
			filter.ParkedAfter = now.Add(-*f.newer)
		}
	}
	return raw, filter, nil
}

// rowList is the row numbers of --id.
type rowList []int64

func (l *rowList) String() string { return fmt.Sprint([]int64(*l)) }

func (l *rowList) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("row number %q: not a positive integer", part)
		}
		*l = append(*l, n)
	}
	return nil
}

// openedOutbox is an outbox table opened by URL.
type openedOutbox struct {
	admin.OutboxTable
	url string
}

func (o *openedOutbox) where() string {
	return fmt.Sprintf("outbox table %s on %s", o.Table(), redact.URL(o.url))
}

// openOutbox opens the outbox table at raw: postgres://, postgresql://,
// mysql:// or sqlite://path, with ?table= or table (the --table flag)
// naming it.
func openOutbox(ctx context.Context, raw, table string) (*openedOutbox, error) {
	t, err := admin.OpenOutbox(ctx, raw, table)
	switch {
	case errors.Is(err, admin.ErrBadURL) && strings.Contains(err.Error(), "no outbox registered"):
		return nil, cli.Usagef("--store %s: the outbox is on postgres://, mysql:// or sqlite://", redact.URL(raw))
	case errors.Is(err, admin.ErrBadURL):
		return nil, cli.Usagef("--store: %s", strings.TrimPrefix(err.Error(), "idemq: "+admin.ErrBadURL.Error()+": "))
	case err != nil:
		return nil, err
	}
	return &openedOutbox{OutboxTable: t, url: raw}, nil
}

// useTable opens the outbox table at raw that the flags name, runs use on
// it and closes it.
func (f *outboxFlags) useTable(ctx context.Context, raw string, use func(o *openedOutbox) error) error {
	o, err := openOutbox(ctx, raw, *f.table)
	if err != nil {
		return err
	}
	defer o.Close()
	return outboxError(use(o), raw)
}

// outboxError is err of a query on the outbox table at raw, without its
// credentials; a table that predates parking gets a hint.
func outboxError(err error, raw string) error {
	err = hideSecrets(err, raw)
	if err != nil && strings.Contains(err.Error(), "parked_at") {
		return fmt.Errorf("%w (a table created before rows could be parked gets its parked_at and last_error columns from the outbox's Migrate, which a relay's service runs)", err)
	}
	return err
}

// parseSelection parses the args of redrive and purge, which need row
// numbers or --all.
func parseSelection(f *outboxFlags, all *bool, args []string, verb string) (string, outbox.ParkedFilter, error) {
	raw, filter, err := f.parse(args)
	if err != nil {
		return "", filter, err
	}
	switch {
	case len(filter.Seqs) == 0 && !*all:
		return "", filter, cli.Usagef("give the rows to %s (--id ROW…), or --all (narrowed by --key, --cause, --older-than and --newer-than)", verb)
	case len(filter.Seqs) > 0 && *all:
		return "", filter, cli.Usagef("give either --id or --all, not both")
	}
	return raw, filter, nil
}

// describe says which parked rows filter selects.
func describe(filter outbox.ParkedFilter) string {
	what := "all parked rows"
	if len(filter.Seqs) > 0 {
		ids := make([]string, len(filter.Seqs))
		for i, s := range filter.Seqs {
			ids[i] = strconv.FormatInt(s, 10)
		}
		what = "parked rows " + listIDs(ids, 20)
	}
	if filter.Key != "" {
		what += fmt.Sprintf(" of key %q", filter.Key)
	}
	if !filter.ParkedBefore.IsZero() {
		what += " parked before " + filter.ParkedBefore.UTC().Format(time.RFC3339)
	}
	if !filter.ParkedAfter.IsZero() {
		what += " parked after " + filter.ParkedAfter.UTC().Format(time.RFC3339)
	}
	if filter.Cause != "" {
		what += fmt.Sprintf(" whose cause contains %q", filter.Cause)
	}
	return what
}

const outboxListUsage = `Usage: idemq outbox list --store URL [--id ROW…] [--key KEY] [--cause TEXT] [--older-than D] [--newer-than D] [--limit N] [--json]

Shows the parked rows, oldest first: the row number (what redrive and
purge take), the message id, ordering key, destination, failed attempts,
when it was parked, the body's size and the cause (the last publish's
error; cut short in the table, whole in --json).
`

// parkedRowJSON is one row of list --json.
type parkedRowJSON struct {
	Row         int64
	ID          string
	Key         string
	Destination string
	Attempts    int
	CreatedAt   string // RFC 3339, UTC
	ParkedAt    string
	BodyBytes   int64
	Cause       string
}

func runOutboxList(ctx context.Context, args []string, stdout, _ io.Writer) error {
	f := newOutboxFlags("list", outboxListUsage, stdout, true)
	limit := f.Int("limit", 100, "show at most this many rows (0: all)")
	asJSON := f.Bool("json", false, "print a JSON array, one object per row")
	raw, filter, err := f.parse(args)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return cli.Usagef("--limit %d: must not be negative", *limit)
	}
	return f.useTable(ctx, raw, func(o *openedOutbox) error {
		filter.Limit = *limit
		rows, err := o.Parked(ctx, filter)
		if err != nil {
			return err
		}
		if *asJSON {
			out := make([]parkedRowJSON, len(rows))
			for i, r := range rows {
				out[i] = parkedRowJSON{Row: r.Seq, ID: r.ID, Key: r.Key, Destination: r.Destination, Attempts: r.Attempts,
					CreatedAt: r.CreatedAt.UTC().Format(time.RFC3339Nano), ParkedAt: r.ParkedAt.UTC().Format(time.RFC3339Nano),
					BodyBytes: r.BodySize, Cause: r.Cause}
			}
			return writeJSON(stdout, out)
		}
		fmt.Fprintf(stdout, "%s: %d parked rows shown\n", o.where(), len(rows))
		if *limit > 0 && len(rows) == *limit {
			fmt.Fprintf(stdout, "(the first %d; --limit 0 shows all)\n", *limit)
		}
		if len(rows) == 0 {
			return nil
		}
		tw := newTable(stdout, "ROW\tID\tKEY\tDESTINATION\tATTEMPTS\tPARKED AT\tBYTES\tCAUSE")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", r.Seq, r.ID, cmp.Or(r.Key, "-"), r.Destination, r.Attempts,
				r.ParkedAt.UTC().Format(time.RFC3339), r.BodySize, shorten(r.Cause, 100))
		}
		return tw.Flush()
	})
}

// shorten puts s on one line of at most n runes.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

const outboxRedriveUsage = `Usage: idemq outbox redrive --store URL (--id ROW… | --all [--key KEY] [--cause TEXT] [--older-than D] [--newer-than D]) [--dry-run]

Makes parked rows pending again, to be published at once: their failed
attempts start from zero and their cause is cleared. Fix what made them
fail first (the destination, the message's size), or they park again. A
redriven row keeps its place in its key: the rows held behind it follow
it. With --dry-run it only shows what it would redrive.
`

func runOutboxRedrive(ctx context.Context, args []string, stdout, _ io.Writer) error {
	f := newOutboxFlags("redrive", outboxRedriveUsage, stdout, true)
	all := f.Bool("all", false, "redrive every parked row (that --key and --cause select)")
	dry := f.Bool("dry-run", false, "show what would be redriven, change nothing")
	raw, filter, err := parseSelection(f, all, args, "redrive")
	if err != nil {
		return err
	}
	return f.useTable(ctx, raw, func(o *openedOutbox) error {
		if *dry {
			rows, err := o.Parked(ctx, filter)
			if err != nil {
				return err
			}
			seqs := make([]string, len(rows))
			for i, r := range rows {
				seqs[i] = strconv.FormatInt(r.Seq, 10)
			}
			fmt.Fprintf(stdout, "would redrive %d of %s in %s", len(rows), describe(filter), o.where())
			if len(rows) > 0 {
				fmt.Fprintf(stdout, ": %s", listIDs(seqs, 20))
			}
			fmt.Fprintln(stdout, " (dry run: nothing changed)")
			return nil
		}
		n, err := o.Redrive(ctx, filter)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "redrove %d of %s in %s: they are pending again\n", n, describe(filter), o.where())
		return nil
	})
}

const outboxPurgeUsage = `Usage: idemq outbox purge --store URL (--id ROW… | --all [--key KEY] [--cause TEXT] [--older-than D] [--newer-than D]) --yes

Deletes parked rows: their messages are never published. The rows held
behind them in their keys move on. Without --yes it deletes nothing (and
exits 2).
`

func runOutboxPurge(ctx context.Context, args []string, stdout, _ io.Writer) error {
	f := newOutboxFlags("purge", outboxPurgeUsage, stdout, true)
	all := f.Bool("all", false, "purge every parked row (that --key and --cause select)")
	yes := f.Bool("yes", false, "delete the rows (required: without it nothing is deleted)")
	raw, filter, err := parseSelection(f, all, args, "purge")
	if err != nil {
		return err
	}
	if !*yes {
		return cli.Usagef("would delete %s on %s, so their messages are never published: pass --yes to do it", describe(filter), redact.URL(raw))
	}
	return f.useTable(ctx, raw, func(o *openedOutbox) error {
		n, err := o.Purge(ctx, filter)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "purged %d of %s in %s\n", n, describe(filter), o.where())
		return nil
	})
}

const outboxStatsUsage = `Usage: idemq outbox stats --store URL [--json]

Shows the outbox table's backlog: the pending rows and the age of the
oldest (how far the relays lag), the parked rows, and the ordering keys
with pending rows behind a parked row, which wait while the relays hold
parked keys (their default) until the parked row is redriven or purged.
`

// statsJSON is outbox stats --json.
type statsJSON struct {
	Store, Table         string
	Pending              int64
	OldestPendingSeconds float64
	Parked               int64
	HeldKeys, HeldRows   int64
}

func runOutboxStats(ctx context.Context, args []string, stdout, _ io.Writer) error {
	f := newOutboxFlags("stats", outboxStatsUsage, stdout, false)
	asJSON := f.Bool("json", false, "print the statistics as JSON")
	raw, _, err := f.parse(args)
	if err != nil {
		return err
	}
	return f.useTable(ctx, raw, func(o *openedOutbox) error {
		st, err := o.Stats(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, statsJSON{Store: redact.URL(raw), Table: o.Table(), Pending: st.Pending,
				OldestPendingSeconds: st.OldestPending.Seconds(), Parked: st.Parked, HeldKeys: st.HeldKeys, HeldRows: st.HeldRows})
		}
		tw := newTable(stdout, o.where())
		fmt.Fprintf(tw, "pending\t%d\n", st.Pending)
		fmt.Fprintf(tw, "oldest pending\t%s\n", units.Age(st.OldestPending))
		fmt.Fprintf(tw, "parked\t%d\n", st.Parked)
		fmt.Fprintf(tw, "keys held back\t%d (%d pending rows behind parked rows)\n", st.HeldKeys, st.HeldRows)
		return tw.Flush()
	})
}
