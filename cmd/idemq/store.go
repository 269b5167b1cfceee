package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/units"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	_ "github.com/idemq/idemq/brokers/kafka"
	_ "github.com/idemq/idemq/brokers/nats"
	_ "github.com/idemq/idemq/brokers/pubsub"
	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/brokers/redis"
	_ "github.com/idemq/idemq/brokers/sqs"
	_ "github.com/idemq/idemq/brokers/webhook"
	_ "github.com/idemq/idemq/outbox/mysqloutbox"
	_ "github.com/idemq/idemq/outbox/pgoutbox"
	_ "github.com/idemq/idemq/outbox/sqliteoutbox"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// withStore opens the store registered for rawURL's scheme, runs use on
// it and closes it. Stores of either transaction type are accepted:
// operator commands never run a handler.
func withStore(ctx context.Context, rawURL string, use func(s *admin.Store) error) error {
	s, err := admin.OpenStore(ctx, rawURL)
	if err != nil {
		return err
	}
	defer s.Close()
	return use(s)
}

// newTable returns a writer of a table on stdout, its tab-separated cells
// aligned in columns, with head, its first line (the column names, or a
// title without tabs), written; Flush ends the table.
func newTable(stdout io.Writer, head string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, head)
	return tw
}

// parseStore parses a command's args and returns its --store URL.
func parseStore(f *cli.Flags, storeURL func() (string, error), args []string) (string, error) {
	if err := f.Parse(args); err != nil {
		return "", err
	}
	return storeURL()
}

// hideSecrets returns err with every credential of rawURL replaced, keeping
// nothing of the original error chain that could print them.
func hideSecrets(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return errors.New(redact.Error(err, rawURL))
}

const migrateUsage = `Usage: idemq migrate --store URL

Creates the store's dedup table and its indexes if they do not exist. It is
idempotent and safe to run from several deployments at once.
`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("idemq migrate", migrateUsage, stdout)
	raw, err := parseStore(f, f.StoreFlag(), args)
	if err != nil {
		return err
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "dedup table %s is ready on %s\n", s.Table(), redact.URL(raw))
		return nil
	})
}

const pruneUsage = `Usage: idemq prune --store URL --older-than 168h [--batch 1000]

Deletes claims recorded more than --older-than ago, in batches of --batch
rows, each its own short statement, until none is left: no giant DELETE
holds a long lock. Progress goes to stderr. Interrupting (Ctrl-C) stops
after the current batch; what was deleted stays deleted.

A claim pruned while its message can still be redelivered lets that message
apply its effect twice: --older-than must not be shorter than the store's
retention (its ?retention= URL parameter, default 168h) unless --force.
`

func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("idemq prune", pruneUsage, stdout)
	storeURL := f.StoreFlag()
	olderThan := f.Duration("older-than", 0, "delete claims recorded longer ago than this, e.g. 168h (required)")
	batch := f.Int("batch", 1000, "rows per DELETE statement")
	force := f.Bool("force", false, "allow --older-than below the store's retention")
	pause := f.Duration("pause", 0, "pause between batches, to spare a busy database")
	progress := f.Bool("progress", term.IsTerminal(int(os.Stderr.Fd())), "show a progress bar on stderr (default: when stderr is a terminal; otherwise a line per batch)")
	raw, err := parseStore(f, storeURL, args)
	if err != nil {
		return err
	}
	switch {
	case *olderThan <= 0:
		return cli.Usagef("--older-than is required and must be positive, e.g. 168h")
	case *batch < 1 || *batch > 1_000_000:
		return cli.Usagef("--batch %d: must be from 1 to 1000000", *batch)
	case *pause < 0:
		return cli.Usagef("--pause %v: must not be negative", *pause)
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		if r, ok := s.Retention(); ok && !*force && *olderThan < r {
			return cli.Usagef("--older-than %v is shorter than the store's retention %v: a message redelivered after its claim is pruned would be applied twice (lower ?retention= on the URL, or pass --force)", *olderThan, r)
		}
		before := time.Now().Add(-*olderThan)
		var bar *progressbar.ProgressBar
		if *progress {
			bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("pruning "+s.Table()),
				progressbar.OptionShowCount(), progressbar.OptionSetItsString("claims"), progressbar.OptionShowIts(), progressbar.OptionClearOnFinish())
		}
		start := time.Now()
		total, batches := 0, 0
		// Duty 1 with --pause: an operator's prune goes back to back unless
		// told to spare the database.
		_, err := s.Prune(ctx, before, admin.PruneOptions{Batch: *batch, Duty: 1, Pause: *pause, Progress: func(n int) {
			total += n
			batches++
			if bar != nil {
				bar.Add(n)
			} else {
				fmt.Fprintf(stderr, "batch %d: pruned %d (total %d)\n", batches, n, total)
			}
		}})
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(stdout, "interrupted: pruned %d claims from %s in %d batches\n", total, s.Table(), batches)
			return errors.New("interrupted")
		case err != nil:
			return fmt.Errorf("after pruning %d claims: %w", total, err)
		}
		if bar != nil {
			bar.Finish()
		}
		fmt.Fprintf(stdout, "pruned %d claims recorded before %s from %s in %d batches (%v)\n",
			total, before.UTC().Format(time.RFC3339), s.Table(), batches, time.Since(start).Round(time.Millisecond))
		return nil
	})
}

const statsUsage = `Usage: idemq stats --store URL [--broker [CONSUMER=]URL ...] [--json]

Shows the dedup table: claims per consumer with the oldest and newest claim,
the claims in progress of leased consumers (IN PROGRESS: leases held, and how
many of them expired, whose messages the next delivery takes over), and the
table's size on disk (with its indexes) as the database reports it.
It counts every row, so on a very large table it takes as long as a scan.

With --broker (a consumer's broker URL), it also compares the store's
retention with how long that broker can still redeliver a message (SQS: the
queue's and its dead-letter queue's retention; Kafka: the topic's
retention.ms; NATS: the stream's and its dead-letter stream's MaxAge;
RabbitMQ: twice message_ttl, or unbounded), and says when claims are pruned
too soon. Repeat --broker once per consumer, each as CONSUMER=URL, to see
the comparison beside that consumer's claims. The broker is opened as the
consumer opens it (a RabbitMQ queue is declared unless the URL says
declare=false).
`

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("idemq stats", statsUsage, stdout)
	storeURL := f.StoreFlag()
	// Collected raw and checked after parsing: the flag package's own
	// errors quote the value, which may hold a password.
	var rawBrokers []string
	f.Func("broker", "a consumer's broker `URL`, or CONSUMER=URL: compare the store's retention with the broker's redelivery horizon (repeatable)", func(v string) error {
		rawBrokers = append(rawBrokers, v)
		return nil
	})
	asJSON := f.Bool("json", false, "print the statistics as JSON")
	raw, err := parseStore(f, storeURL, args)
	if err != nil {
		return err
	}
	brokers := make([]brokerArg, 0, len(rawBrokers))
	for _, v := range rawBrokers {
		b, ok := parseBrokerArg(v)
		if !ok {
			return cli.Usagef("--broker %s: want CONSUMER=URL or URL", redact.URL(v))
		}
		brokers = append(brokers, b)
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		st, err := s.Stats(ctx)
		if err != nil {
			return err
		}
		var hzs []*horizonCheck
		for _, b := range brokers {
			hz, err := checkHorizon(ctx, s, b.url)
			if err != nil {
				return err
			}
			hz.Consumer = b.consumer
			hzs = append(hzs, hz)
		}
		if *asJSON {
			return writeJSON(stdout, struct {
				Store string
				admin.TableStats
				Horizons []*horizonCheck `json:",omitempty"`
			}{redact.URL(raw), st, hzs})
		}
		size := "unknown"
		if st.SizeBytes > 0 {
			size = units.Bytes(st.SizeBytes)
		}
		fmt.Fprintf(stdout, "table %s on %s: %d claims, %s on disk\n", st.Table, redact.URL(raw), st.Rows, size)
		for _, hz := range hzs {
			if hz.Consumer != "" && !slices.ContainsFunc(st.Consumers, func(c admin.ConsumerStats) bool { return c.Consumer == hz.Consumer }) {
				fmt.Fprintf(stdout, "%s (no claims yet)\n", hz)
				continue
			}
			fmt.Fprintln(stdout, hz)
		}
		if len(st.Consumers) == 0 {
			fmt.Fprintln(stdout, "no claims")
			return nil
		}
		now := time.Now()
		named := map[string]*horizonCheck{}
		for _, hz := range hzs {
			if hz.Consumer != "" {
				named[hz.Consumer] = hz
			}
		}
		leased := slices.ContainsFunc(st.Consumers, func(c admin.ConsumerStats) bool { return c.Leases > 0 })
		head := "CONSUMER\tCLAIMS\tOLDEST\tAGE\tNEWEST"
		if leased {
			head += "\tIN PROGRESS"
		}
		if len(named) > 0 {
			head += "\tHORIZON"
		}
		tw := newTable(stdout, head)
		for _, c := range st.Consumers {
			oldest, ago, newest := "-", "-", "-"
			if !c.Oldest.IsZero() {
				oldest, ago, newest = c.Oldest.UTC().Format(time.RFC3339), units.Age(now.Sub(c.Oldest)), c.Newest.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s", c.Consumer, c.Rows, oldest, ago, newest)
			if leased {
				fmt.Fprintf(tw, "\t%d (%d expired)", c.Leases, c.ExpiredLeases)
			}
			if len(named) > 0 {
				fmt.Fprintf(tw, "\t%s", named[c.Consumer].cell())
			}
			fmt.Fprintln(tw)
		}
		return tw.Flush()
	})
}

// brokerArg is one --broker: a source URL, and the consumer reading it
// when the operator named one.
type brokerArg struct{ consumer, url string }

// parseBrokerArg splits CONSUMER=URL. A bare URL has no consumer: its first
// '=' comes after the scheme's "://".
func parseBrokerArg(v string) (brokerArg, bool) {
	eq, scheme := strings.Index(v, "="), strings.Index(v, "://")
	if eq < 0 || (scheme >= 0 && scheme < eq) {
		return brokerArg{url: v}, v != ""
	}
	b := brokerArg{consumer: v[:eq], url: v[eq+1:]}
	return b, b.consumer != "" && b.url != ""
}

// horizonCheck is the store's retention against a broker's redelivery
// horizon.
type horizonCheck struct {
	Consumer  string `json:",omitempty"` // as the operator named it
	Broker    string
	Retention string // the store's, or "unknown"
	Horizon   string // the broker's, "unbounded", or "unknown"
	// Short is true when claims are pruned while the broker can still
	// redeliver their messages.
	Short bool
}

// cell is the check in a consumer's row of the stats table.
func (h *horizonCheck) cell() string {
	switch {
	case h == nil:
		return "-"
	case h.Short:
		return h.Horizon + " TOO SHORT"
	case h.Retention == "unknown" || h.Horizon == "unknown":
		return h.Horizon + " (cannot compare)"
	}
	return h.Horizon + " ok"
}

func (h *horizonCheck) String() string {
	verdict := "claims outlive redeliveries"
	switch {
	case h.Short:
		verdict = "TOO SHORT: a message redelivered after its claim is pruned is applied twice (raise the store's retention or bound the broker's)"
	case h.Retention == "unknown" || h.Horizon == "unknown":
		verdict = "cannot compare"
	}
	line := fmt.Sprintf("retention %s, redelivery horizon of %s: %s: %s", h.Retention, h.Broker, h.Horizon, verdict)
	if h.Consumer != "" {
		line = "consumer " + h.Consumer + ": " + line
	}
	return line
}

// checkHorizon opens the broker at brokerURL as a consumer would and
// compares its redelivery horizon with the store's retention.
func checkHorizon(ctx context.Context, s *admin.Store, brokerURL string) (*horizonCheck, error) {
	hz, err := admin.CheckHorizon(ctx, s, brokerURL)
	if err != nil {
		return nil, err
	}
	h := &horizonCheck{Broker: hz.Broker, Retention: "unknown", Horizon: "unknown", Short: hz.Short()}
	if hz.RetentionKnown {
		h.Retention = hz.Retention.String()
	}
	switch {
	case !hz.HorizonKnown:
	case hz.Unbounded():
		h.Horizon = "unbounded"
	default:
		h.Horizon = hz.Horizon.String()
	}
	return h, nil
}
