package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/cli"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	_ "github.com/idemq/idemq/brokers/kafka"
	_ "github.com/idemq/idemq/brokers/nats"
	_ "github.com/idemq/idemq/brokers/rabbitmq"
	_ "github.com/idemq/idemq/brokers/sqs"
	"github.com/idemq/idemq/core"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// openedStore is a store opened by URL, whatever its transaction type, with
// the operator interfaces it implements.
type openedStore struct {
	url   string
	store driver.Closer
}

// openStore opens the store registered for rawURL's scheme. Stores of
// either transaction type are accepted: operator commands never run a
// handler.
func openStore(ctx context.Context, rawURL string) (*openedStore, error) {
	s, err := driver.OpenStore(ctx, rawURL)
	if err != nil {
		return nil, hideSecrets(err, rawURL)
	}
	return &openedStore{url: rawURL, store: s}, nil
}

func (o *openedStore) Close() { o.store.Close() }

// parseStore parses a command's args and returns its --store URL.
func parseStore(f *cli.Flags, storeURL func() (string, error), args []string) (string, error) {
	if err := f.Parse(args); err != nil {
		return "", err
	}
	return storeURL()
}

// storeThat opens the store at raw and returns it with the operator
// interface C the command needs; an error says what the store cannot do.
func storeThat[C any](ctx context.Context, raw, cannot string) (*openedStore, C, error) {
	var c C
	s, err := openStore(ctx, raw)
	if err != nil {
		return nil, c, err
	}
	c, ok := s.store.(C)
	if !ok {
		s.Close()
		return nil, c, fmt.Errorf("the store at %s cannot %s", core.Redact(raw), cannot)
	}
	return s, c, nil
}

// table is the dedup table's name, if the store tells it.
func (o *openedStore) table() string {
	if t, ok := o.store.(interface{ Table() string }); ok {
		return t.Table()
	}
	return "(dedup table)"
}

// hideSecrets returns err with every credential of rawURL replaced, keeping
// nothing of the original error chain that could print them.
func hideSecrets(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return errors.New(core.RedactError(err, rawURL))
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
	s, m, err := storeThat[driver.Migrator](ctx, raw, "migrate itself")
	if err != nil {
		return err
	}
	defer s.Close()
	if err := m.Migrate(ctx); err != nil {
		return hideSecrets(err, raw)
	}
	fmt.Fprintf(stdout, "dedup table %s is ready on %s\n", s.table(), core.Redact(raw))
	return nil
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
	s, p, err := storeThat[driver.Pruner](ctx, raw, "prune")
	if err != nil {
		return err
	}
	defer s.Close()
	if r, ok := s.store.(driver.Retentioner); ok && !*force && *olderThan < r.Retention() {
		return cli.Usagef("--older-than %v is shorter than the store's retention %v: a message redelivered after its claim is pruned would be applied twice (lower ?retention= on the URL, or pass --force)", *olderThan, r.Retention())
	}
	before := time.Now().Add(-*olderThan)
	var bar *progressbar.ProgressBar
	if *progress {
		bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("pruning "+s.table()),
			progressbar.OptionShowCount(), progressbar.OptionSetItsString("claims"), progressbar.OptionShowIts(), progressbar.OptionClearOnFinish())
	}
	start := time.Now()
	total, batches := 0, 0
	interrupted := func() error {
		fmt.Fprintf(stdout, "interrupted: pruned %d claims from %s in %d batches\n", total, s.table(), batches)
		return errors.New("interrupted")
	}
	for {
		if ctx.Err() != nil {
			return interrupted()
		}
		n, err := p.Prune(ctx, before, *batch)
		if err != nil {
			if ctx.Err() != nil {
				return interrupted()
			}
			return fmt.Errorf("after pruning %d claims: %w", total, hideSecrets(err, raw))
		}
		total += n
		batches++
		if bar != nil {
			bar.Add(n)
		} else {
			fmt.Fprintf(stderr, "batch %d: pruned %d (total %d)\n", batches, n, total)
		}
		if n < *batch {
			break
		}
		if *pause > 0 {
			select {
			case <-time.After(*pause):
			case <-ctx.Done():
			}
		}
	}
	if bar != nil {
		bar.Finish()
	}
	fmt.Fprintf(stdout, "pruned %d claims recorded before %s from %s in %d batches (%v)\n",
		total, before.UTC().Format(time.RFC3339), s.table(), batches, time.Since(start).Round(time.Millisecond))
	return nil
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
			return cli.Usagef("--broker %s: want CONSUMER=URL or URL", core.Redact(v))
		}
		brokers = append(brokers, b)
	}
	s, in, err := storeThat[driver.Inspector](ctx, raw, "describe its table")
	if err != nil {
		return err
	}
	defer s.Close()
	st, err := in.Inspect(ctx)
	if err != nil {
		return hideSecrets(err, raw)
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
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Store string
			driver.TableStats
			Horizons []*horizonCheck `json:",omitempty"`
		}{core.Redact(raw), st, hzs})
	}
	size := "unknown"
	if st.SizeBytes > 0 {
		size = formatBytes(st.SizeBytes)
	}
	fmt.Fprintf(stdout, "table %s on %s: %d claims, %s on disk\n", st.Table, core.Redact(raw), st.Rows, size)
	for _, hz := range hzs {
		if hz.Consumer != "" && !slices.ContainsFunc(st.Consumers, func(c driver.ConsumerStats) bool { return c.Consumer == hz.Consumer }) {
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
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	named := map[string]*horizonCheck{}
	for _, hz := range hzs {
		if hz.Consumer != "" {
			named[hz.Consumer] = hz
		}
	}
	leased := slices.ContainsFunc(st.Consumers, func(c driver.ConsumerStats) bool { return c.Leases > 0 })
	head := "CONSUMER\tCLAIMS\tOLDEST\tAGE\tNEWEST"
	if leased {
		head += "\tIN PROGRESS"
	}
	if len(named) > 0 {
		head += "\tHORIZON"
	}
	fmt.Fprintln(tw, head)
	for _, c := range st.Consumers {
		oldest, ago, newest := "-", "-", "-"
		if !c.Oldest.IsZero() {
			oldest, ago, newest = c.Oldest.UTC().Format(time.RFC3339), age(now.Sub(c.Oldest)), c.Newest.UTC().Format(time.RFC3339)
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
func checkHorizon(ctx context.Context, s *openedStore, brokerURL string) (*horizonCheck, error) {
	src, err := driver.OpenSource(ctx, brokerURL, driver.OpenConfig{})
	if err != nil {
		return nil, hideSecrets(err, brokerURL)
	}
	defer src.Close()
	h := &horizonCheck{Broker: core.Redact(brokerURL), Retention: "unknown", Horizon: "unknown"}
	var retention, horizon time.Duration
	rt, rok := s.store.(driver.Retentioner)
	if rok {
		retention = rt.Retention()
		h.Retention = retention.String()
	}
	hz, hok := src.(driver.RedeliveryHorizoner)
	if hok {
		horizon, hok = hz.RedeliveryHorizon(ctx)
	}
	switch {
	case !hok:
	case horizon == driver.Unbounded:
		h.Horizon = "unbounded"
	default:
		h.Horizon = horizon.String()
	}
	h.Short = rok && hok && retention > 0 && retention < horizon
	return h, nil
}

// age renders a duration the way operators compare it with a retention.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%.1fd", d.Hours()/24)
}

func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
