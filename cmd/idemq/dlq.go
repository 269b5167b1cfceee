package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/units"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

const dlqUsage = `Usage: idemq dlq <list|groups|show|redrive|purge> --broker URL [flags] [ID…]

Reads and operates the dead letters of one consumer: the messages idemq
parked with their cause. --broker is the consumer's own source URL
(amqp://…?queue=Q, kafka://…/TOPIC?group=G, kafka+share://…/TOPIC?group=G,
sqs://…/queue, pubsub://PROJECT/SUBSCRIPTION, nats://…/STREAM?consumer=C&subject=S,
redis://…/STREAM?group=G, webhook://host:port/PATH?park_dir=DIR); its
dead-letter queue, topic, stream or park directory is the one the consumer
parks to. A parked webhook request cannot be redriven (its signature would
not verify again): the provider resends it.

  list     the parked messages: id, cause, attempts, origin, age, size
  groups   the parked messages grouped by cause (ids, numbers and quoted
           values masked, as the console groups them), the largest first
  show     one message whole (headers and body), every parked copy of ID
  redrive  put parked messages back on the queue or topic they came from,
           with their id, key, headers and body (without the cause, and
           with the attempt count starting again); each leaves the
           dead-letter queue only after the broker confirmed the publish
  purge    delete parked messages (needs --yes, and --all or a filter)

A redriven message whose id was applied meanwhile is decided Duplicate, as
long as its claim exists: redrive refuses messages parked longer ago than
the store's retention (give --store URL or --retention D) unless --force.

Filters (list, groups, redrive, purge; the console's, the same way): ids
(ID… or --id ID, repeatable), --ref REF (a parked copy as list prints it;
how to pick a message without an id, repeatable), --cause TEXT (part of
the cause, in any case), --group TEXT (a cause group as groups prints
it), --older-than D, --newer-than D (how long ago it was parked).

Run 'idemq dlq <subcommand> --help' for its flags.
`

// dlqFilter is the selection flags the dlq subcommands share.
type dlqFilter struct {
	ids, refs            idList
	cause, group         string
	olderThan, newerThan time.Duration
}

// idList is a repeatable --id flag.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error {
	if v == "" {
		return fmt.Errorf("empty id")
	}
	*l = append(*l, v)
	return nil
}

func (d *dlqFilter) define(f *cli.Flags) {
	f.Var(&d.ids, "id", "only the message with this id, as a plain ID argument (repeatable)")
	f.Var(&d.refs, "ref", "only the parked copy with this ref, as list and show print it: how to pick a message without an id (repeatable)")
	f.StringVar(&d.cause, "cause", "", "only messages whose cause holds this text, in any case")
	f.StringVar(&d.group, "group", "", "only messages of this cause group, as groups prints it")
	f.DurationVar(&d.olderThan, "older-than", 0, "only messages parked at least this long ago")
	f.DurationVar(&d.newerThan, "newer-than", 0, "only messages parked less than this long ago")
}

// parse parses a subcommand's args, flags and message ids mixed, and
// returns the selection they make: the ids given plainly are --id's.
func (d *dlqFilter) parse(f *cli.Flags, args []string) (admin.Selection, error) {
	ids, err := parseIDs(f, args)
	if err != nil {
		return admin.Selection{}, err
	}
	if d.olderThan < 0 || d.newerThan < 0 {
		return admin.Selection{}, cli.Usagef("--older-than and --newer-than must be positive")
	}
	for _, id := range ids {
		if id == "" {
			return admin.Selection{}, cli.Usagef("empty id")
		}
	}
	return admin.Selection{IDs: append(slices.Clone(d.ids), ids...), Refs: d.refs, Cause: d.cause, Group: d.group,
		OlderThan: d.olderThan, NewerThan: d.newerThan}, nil
}

// dlqCommand is a dlq subcommand's flags: --broker and, for those that
// select messages, the filters.
type dlqCommand struct {
	*cli.Flags
	broker *string
	flt    dlqFilter
}

// newDLQCommand returns the flags of subcommand sub: --broker, and the
// filters when filters is true.
func newDLQCommand(sub, usage string, stdout io.Writer, filters bool) *dlqCommand {
	c := &dlqCommand{Flags: cli.NewFlags("idemq dlq "+sub, usage, stdout)}
	c.broker = c.String("broker", "", "the consumer's broker URL, as its source is opened (required)")
	if filters {
		c.flt.define(c.Flags)
	}
	return c
}

// selection parses args, flags and message ids mixed, and returns the
// selection the filters make.
func (c *dlqCommand) selection(args []string) (admin.Selection, error) {
	return c.flt.parse(c.Flags, args)
}

// open checks --broker and opens its dead-letter queue.
func (c *dlqCommand) open(ctx context.Context) (admin.DeadLetterQueue, error) {
	broker := *c.broker
	if broker == "" {
		return nil, cli.Usagef("--broker is required")
	}
	if u, err := redact.ParseURL(broker); err != nil {
		return nil, cli.Usagef("--broker: %v", err)
	} else if u.Scheme == "" {
		return nil, cli.Usagef("--broker %s is not a URL like amqp://host/?queue=Q, kafka://host/TOPIC?group=G, sqs://…/queue, pubsub://PROJECT/SUBSCRIPTION, nats://host/STREAM?consumer=C, redis://host:6379/STREAM?group=G or webhook://host:port/PATH?park_dir=DIR", redact.URL(broker))
	}
	if err := brokerHint(broker); err != nil {
		return nil, err
	}
	return admin.OpenDeadLetters(ctx, broker)
}

// scan calls each with every message parked in q that sel matches at
// now. Its error does not hold the broker URL's credentials.
func (c *dlqCommand) scan(ctx context.Context, q admin.DeadLetterQueue, sel admin.Selection, now time.Time, each func(*admin.Parked)) error {
	err := q.Scan(ctx, func(p *admin.Parked) error {
		if sel.Match(p, now) {
			each(p)
		}
		return nil
	})
	return hideSecrets(err, *c.broker)
}

// eachMatch parses args, opens the dead-letter queue and calls each with
// every message the filters choose at now; it returns the queue's name.
func (c *dlqCommand) eachMatch(ctx context.Context, args []string, now time.Time, each func(*admin.Parked)) (string, error) {
	sel, err := c.selection(args)
	if err != nil {
		return "", err
	}
	q, err := c.open(ctx)
	if err != nil {
		return "", err
	}
	defer q.Close()
	return q.Name(), c.scan(ctx, q, sel, now, each)
}

// brokerHint says what to give instead of a source URL whose dead letters
// this command cannot reach that way: nil for any other.
func brokerHint(broker string) error {
	u, err := redact.ParseURL(broker)
	if err != nil {
		return nil
	}
	switch strings.ToLower(u.Scheme) {
	case "mem":
		return cli.Usagef("%s: a memory broker lives inside the process that runs it; read its dead letters there (memory.Broker.DeadLetters, or the console mounted in that process)", redact.URL(broker))
	}
	return nil
}

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runSubcommand(ctx, "dlq", dlqUsage, []command{
		{"list", "", runDLQList}, {"groups", "", runDLQGroups}, {"show", "", runDLQShow}, {"redrive", "", runDLQRedrive}, {"purge", "", runDLQPurge},
	}, args, stdout, stderr)
}

// parkedJSON is one parked message in --json output.
type parkedJSON struct {
	Ref, ID, Cause      string
	Attempt             int
	Origin, Destination string
	ParkedAt            string // RFC 3339, UTC
	AgeSeconds          int64
	Key                 string `json:",omitempty"`
	BodyBytes           int
	Headers             map[string]string `json:",omitempty"`
	Body                string            `json:",omitempty"` // show only: the body as text when it is UTF-8
	BodyBase64          []byte            `json:",omitempty"` // show only: the body otherwise
}

func toJSON(p *admin.Parked, now time.Time, whole bool) parkedJSON {
	j := parkedJSON{
		Ref: p.Ref, ID: p.ID, Cause: p.Cause, Attempt: p.Attempt, Origin: p.Origin, Destination: p.Destination,
		ParkedAt: p.ParkedAt.UTC().Format(time.RFC3339Nano), AgeSeconds: int64(now.Sub(p.ParkedAt) / time.Second),
		Key: p.Key, BodyBytes: len(p.Body),
	}
	if whole {
		j.Headers = p.Headers
		if utf8.Valid(p.Body) {
			j.Body = string(p.Body)
		} else {
			j.BodyBase64 = p.Body
		}
	}
	return j
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

const dlqListUsage = `Usage: idemq dlq list --broker URL [filters] [--json] [ID…]

Lists the consumer's parked messages, oldest first where the broker keeps an
order: id, attempts, age, origin, body size and cause. Listing leaves them
parked.
`

func runDLQList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newDLQCommand("list", dlqListUsage, stdout, true)
	asJSON := c.Bool("json", false, "print a JSON array, one object per message")
	now := time.Now()
	var list []parkedJSON
	queue, err := c.eachMatch(ctx, args, now, func(p *admin.Parked) { list = append(list, toJSON(p, now, false)) })
	if err != nil {
		return err
	}
	if *asJSON {
		if list == nil {
			list = []parkedJSON{}
		}
		return writeJSON(stdout, list)
	}
	fmt.Fprintf(stdout, "%d parked in %s on %s\n", len(list), queue, redact.URL(*c.broker))
	if len(list) == 0 {
		return nil
	}
	tw := newTable(stdout, "ID\tREF\tATTEMPTS\tAGE\tORIGIN\tBYTES\tCAUSE")
	for _, p := range list {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\n", cmp.Or(p.ID, "(none)"), p.Ref, p.Attempt, units.Age(time.Duration(p.AgeSeconds)*time.Second), p.Origin, p.BodyBytes, shorten(p.Cause, 100))
	}
	return tw.Flush()
}

const dlqGroupsUsage = `Usage: idemq dlq groups --broker URL [filters] [--json] [ID…]

Groups the consumer's parked messages by cause, the largest group first:
how many, when the oldest and newest were parked, and the cause with what
varies from message to message masked (its id, other ids mixing letters
and digits, numbers, quoted values), as the console groups them. Give a
group to --group of list, redrive or purge to act on it.
`

// groupJSON is one cause group in --json output.
type groupJSON struct {
	Group          string
	Count          int
	Oldest, Newest string // RFC 3339, UTC
	Example        string // the id (or ref) of its first message
}

func runDLQGroups(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newDLQCommand("groups", dlqGroupsUsage, stdout, true)
	asJSON := c.Bool("json", false, "print a JSON array, one object per group")
	now := time.Now()
	g := admin.NewGrouper(1)
	n := 0
	queue, err := c.eachMatch(ctx, args, now, func(p *admin.Parked) {
		n++
		g.Add(&admin.Parked{Ref: p.Ref, ID: p.ID, Cause: p.Cause, ParkedAt: p.ParkedAt})
	})
	if err != nil {
		return err
	}
	groups := g.Groups()
	out := make([]groupJSON, len(groups))
	for i, grp := range groups {
		first := grp.Parked[0]
		out[i] = groupJSON{Group: grp.Key, Count: grp.Count, Oldest: grp.Oldest.UTC().Format(time.RFC3339Nano),
			Newest: grp.Newest.UTC().Format(time.RFC3339Nano), Example: cmp.Or(first.ID, "ref "+first.Ref)}
	}
	if *asJSON {
		return writeJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "%d parked in %s on %s, in %d cause groups\n", n, queue, redact.URL(*c.broker), len(groups))
	if len(groups) == 0 {
		return nil
	}
	tw := newTable(stdout, "COUNT\tPARKED\tEXAMPLE\tGROUP")
	for i, grp := range groups {
		ages := units.Age(now.Sub(grp.Oldest))
		if !grp.Newest.Equal(grp.Oldest) {
			ages += " to " + units.Age(now.Sub(grp.Newest))
		}
		fmt.Fprintf(tw, "%d\t%s ago\t%s\t%s\n", grp.Count, ages, out[i].Example, grp.Key)
	}
	return tw.Flush()
}

const dlqShowUsage = `Usage: idemq dlq show --broker URL [--json] (ID | --id ID | --ref REF)

Prints every parked copy of the message ID whole, or the one copy REF (as
list prints it: how to read a message without an id): where it came from,
why it was parked, its headers and its body. Exits 1 when no copy is
parked.
`

func runDLQShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newDLQCommand("show", dlqShowUsage, stdout, false)
	asJSON := c.Bool("json", false, "print a JSON array of the copies, bodies included")
	ref := c.String("ref", "", "the parked copy with this ref, as list prints it, instead of an id")
	var idFlag idList
	c.Var(&idFlag, "id", "the message with this id, as a plain ID argument")
	ids, err := parseIDs(c.Flags, args)
	if err != nil {
		return err
	}
	ids = append(idFlag, ids...)
	switch {
	case *ref != "" && len(ids) > 0:
		return cli.Usagef("give a message id or --ref, not both")
	case *ref == "" && len(ids) != 1:
		return cli.Usagef("give exactly one message id, or --ref REF (list prints each copy's ref)")
	}
	sel, what := admin.Selection{Refs: []string{*ref}}, "ref "+*ref
	if *ref == "" {
		sel, what = admin.Selection{IDs: ids[:1]}, strconv.Quote(ids[0])
	}
	q, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	now := time.Now()
	var found []*admin.Parked
	if err := c.scan(ctx, q, sel, now, func(p *admin.Parked) { found = append(found, p) }); err != nil {
		return err
	}
	if len(found) == 0 {
		return fmt.Errorf("%s is not parked in %s", what, q.Name())
	}
	if *asJSON {
		out := make([]parkedJSON, len(found))
		for i, p := range found {
			out[i] = toJSON(p, now, true)
		}
		return writeJSON(stdout, out)
	}
	for i, p := range found {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		id := p.ID
		if id == "" {
			id = "(none)"
		}
		fmt.Fprintf(stdout, "id:          %s\nref:         %s\ncause:       %s\nattempts:    %d\norigin:      %s\nredrives to: %s\nparked at:   %s (%s ago)\n",
			id, p.Ref, p.Cause, p.Attempt, p.Origin, p.Destination, p.ParkedAt.UTC().Format(time.RFC3339), units.Age(now.Sub(p.ParkedAt)))
		if p.Key != "" {
			fmt.Fprintf(stdout, "key:         %s\n", p.Key)
		}
		fmt.Fprintln(stdout, "headers:")
		for _, k := range slices.Sorted(maps.Keys(p.Headers)) {
			fmt.Fprintf(stdout, "  %s: %s\n", k, p.Headers[k])
		}
		fmt.Fprintf(stdout, "body (%d bytes):\n", len(p.Body))
		if utf8.Valid(p.Body) {
			fmt.Fprintf(stdout, "%s\n", p.Body)
		} else {
			fmt.Fprintf(stdout, "%x\n", p.Body)
		}
	}
	return nil
}

const dlqRedriveUsage = `Usage: idemq dlq redrive --broker URL (--store URL | --retention D | --force) [filters] [--dry-run] [--json] [ID…]

Puts the parked messages the filters choose (all, without filters) back on
the queue or topic they came from, with their id, key, headers and body but
without the cause, so their attempt count starts again. Each leaves the
dead-letter queue only after the broker confirmed its publish.

A redriven message whose id was applied meanwhile (another copy, a producer's
retry) is decided Duplicate by the consumer while its claim exists. A message
parked longer ago than the store's retention may have a twin whose claim was
pruned, and would then be applied twice: redrive refuses it, says so and
exits 1, unless --force (a --dry-run says what it would refuse, and exits 1
as the redrive would). The retention comes from --store (the consumer's
store URL, ?retention= included) or --retention.

Kafka: every consumer group of the topic receives the redriven record; NATS:
every consumer of the subject receives the redriven message.
`

func runDLQRedrive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newDLQCommand("redrive", dlqRedriveUsage, stdout, true)
	storeURL := c.String("store", "", "the consumer's store URL, to read its claims' retention")
	retentionFlag := c.Duration("retention", 0, "the consumer's store retention, when --store is not given")
	force := c.Bool("force", false, "redrive messages parked longer ago than the retention too")
	dryRun := c.Bool("dry-run", false, "say what would be redriven and refused, and change nothing")
	asJSON := c.Bool("json", false, "print the outcome as a JSON object")
	progress := c.Bool("progress", term.IsTerminal(int(os.Stderr.Fd())), "show a progress bar on stderr (default: when stderr is a terminal)")
	sel, err := c.selection(args)
	if err != nil {
		return err
	}
	if *storeURL != "" && *retentionFlag != 0 {
		return cli.Usagef("give --store or --retention, not both")
	}
	if *retentionFlag < 0 {
		return cli.Usagef("--retention must be positive")
	}
	if *storeURL == "" && *retentionFlag == 0 && !*force {
		return cli.Usagef("give --store URL (or --retention D) so that redrive can refuse messages parked longer ago than the claims are kept, or --force")
	}
	q, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	retention := *retentionFlag
	if *storeURL != "" {
		if retention, err = storeRetention(ctx, *storeURL); err != nil {
			return err
		}
	}

	guard := admin.RedriveGuard{Retention: retention, Force: *force}
	now := time.Now()
	chosen := map[string]bool{} // by Ref
	var picked, refused []parkedJSON
	if err := c.scan(ctx, q, sel, now, func(p *admin.Parked) {
		if guard.Refuses(p, now) {
			refused = append(refused, toJSON(p, now, false))
			return
		}
		chosen[p.Ref] = true
		picked = append(picked, toJSON(p, now, false))
	}); err != nil {
		return err
	}
	out := struct {
		DryRun           bool
		Redriven         int
		Chosen           []parkedJSON
		Refused          []parkedJSON
		RetentionSeconds int64 `json:",omitempty"`
	}{DryRun: *dryRun, Chosen: picked, Refused: refused, RetentionSeconds: int64(retention / time.Second)}
	if !*dryRun && len(chosen) > 0 {
		var bar *progressbar.ProgressBar
		onDone := func(int) {}
		if *progress {
			bar = progressbar.NewOptions(len(chosen), progressbar.OptionSetWriter(stderr),
				progressbar.OptionSetDescription("redriving"), progressbar.OptionShowCount(),
				progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond))
			onDone = func(done int) { _ = bar.Set(done) }
		}
		n, err := admin.Redrive(ctx, q, func(p *admin.Parked) bool { return chosen[p.Ref] }, onDone)
		if bar != nil {
			_ = bar.Finish()
			fmt.Fprintln(stderr)
		}
		out.Redriven = n
		if err != nil {
			return fmt.Errorf("redrove %d of %d, then: %w (the rest are still parked)", n, len(chosen), hideSecrets(err, *c.broker))
		}
	}
	if *asJSON {
		if err := writeJSON(stdout, out); err != nil {
			return err
		}
	} else {
		verb, n := "redrove", out.Redriven
		if *dryRun {
			verb, n = "would redrive", len(picked)
		}
		fmt.Fprintf(stdout, "%s %d from %s on %s\n", verb, n, q.Name(), redact.URL(*c.broker))
		for _, p := range picked {
			fmt.Fprintf(stdout, "  %s -> %s\n", p.ID, p.Destination)
		}
	}
	if len(refused) > 0 {
		verb := "refused"
		if *dryRun {
			verb = "would refuse"
		}
		for _, p := range refused {
			fmt.Fprintf(stderr, "  %s %s, parked %s ago\n", verb, p.ID, units.Age(time.Duration(p.AgeSeconds)*time.Second))
		}
		return fmt.Errorf("%s %d messages parked longer ago than the store keeps claims (%v): a copy applied before then may have lost its claim to pruning, and this one would be applied again; redrive them with --force once you know they were not applied", verb, len(refused), retention)
	}
	return nil
}

// storeRetention opens the store at raw and returns how long it keeps
// claims.
func storeRetention(ctx context.Context, raw string) (r time.Duration, err error) {
	err = withStore(ctx, raw, func(s *admin.Store) error {
		var ok bool
		if r, ok = s.Retention(); !ok {
			return fmt.Errorf("the store at %s cannot tell its retention", redact.URL(raw))
		}
		return nil
	})
	return r, err
}

const dlqPurgeUsage = `Usage: idemq dlq purge --broker URL (--all | filters | ID…) --yes

Deletes the parked messages the filters choose, or every one with --all.
Without --yes it only says how many it would delete (and exits 2).
`

func runDLQPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newDLQCommand("purge", dlqPurgeUsage, stdout, true)
	all := c.Bool("all", false, "delete every parked message")
	yes := c.Bool("yes", false, "delete (required: without it nothing is deleted)")
	sel, err := c.selection(args)
	if err != nil {
		return err
	}
	if *all == sel.Narrowed() {
		return cli.Usagef("give --all or a filter (ids, --ref, --cause, --group, --older-than, --newer-than), not both")
	}
	q, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	now := time.Now()
	if !*yes {
		n := 0
		if err := c.scan(ctx, q, sel, now, func(*admin.Parked) { n++ }); err != nil {
			return err
		}
		return cli.Usagef("would delete %d parked messages from %s: pass --yes to do it", n, q.Name())
	}
	n, err := admin.PurgeSelected(ctx, q, sel, now)
	if err != nil {
		return fmt.Errorf("purged %d, then: %w", n, hideSecrets(err, *c.broker))
	}
	fmt.Fprintf(stdout, "purged %d from %s on %s\n", n, q.Name(), redact.URL(*c.broker))
	return nil
}
