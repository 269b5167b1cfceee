package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/internal/redact"
)

// parseIDs parses a command's args, flags and message ids mixed in any
// order (after "--" everything is an id, for ids that start with '-'),
// and returns the ids. The flags' mistakes and --help are handled as
// Flags.Parse handles them.
func parseIDs(f *cli.Flags, args []string) ([]string, error) {
	var ids []string
	rest := args
	for len(rest) > 0 {
		if err := f.FlagSet.Parse(rest); err != nil {
			return nil, f.Parse(rest) // the usage error, or --help
		}
		left := f.Args()
		if used := len(rest) - len(left); used > 0 && rest[used-1] == "--" {
			ids = append(ids, left...)
			break
		}
		if len(left) == 0 {
			break
		}
		ids = append(ids, left[0])
		rest = left[1:]
	}
	if len(args) == 0 {
		if err := f.Parse(nil); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// claimFlags are the flags of lookup and forget, which name a consumer's
// claims: --store and --consumer.
type claimFlags struct {
	*cli.Flags
	storeURL func() (string, error)
	consumer *string
}

// newClaimFlags returns the flags of command name; consumerHelp says what
// its --consumer is for.
func newClaimFlags(name, usage, consumerHelp string, stdout io.Writer) *claimFlags {
	f := &claimFlags{Flags: cli.NewFlags("idemq "+name, usage, stdout)}
	f.storeURL = f.StoreFlag()
	f.consumer = f.String("consumer", "", consumerHelp)
	return f
}

// parse parses args and returns the store URL and the message ids: it
// needs a non-empty --consumer and at least one id.
func (f *claimFlags) parse(args []string) (string, []string, error) {
	ids, err := parseIDs(f.Flags, args)
	if err != nil {
		return "", nil, err
	}
	raw, err := f.storeURL()
	if err != nil {
		return "", nil, err
	}
	switch {
	case *f.consumer == "":
		return "", nil, cli.Usagef("--consumer is required")
	case len(ids) == 0:
		return "", nil, cli.Usagef("give at least one message id")
	}
	for _, id := range ids {
		if id == "" {
			return "", nil, cli.Usagef("empty message id")
		}
	}
	return raw, ids, nil
}

const lookupUsage = `Usage: idemq lookup --store URL --consumer NAME [--json] ID...

Shows, for each message id, whether the consumer has claimed it, when
(RFC 3339, UTC) and the body fingerprint stored with the claim, and the
lease of a message in progress (a leased consumer is applying it): until
when, by the store's clock, and its fencing token. A claimed id's message
is not applied again when it is redelivered; one in progress is not
applied by another consumer before its lease expires. Put ids that start
with '-' after "--".
`

// claimJSON is one id of lookup --json.
type claimJSON struct {
	ID          string
	Claimed     bool
	At          string `json:",omitempty"` // RFC 3339, UTC; only when claimed
	Fingerprint string `json:",omitempty"`
	LeaseUntil  string `json:",omitempty"` // RFC 3339, UTC; only while a lease exists
	LeaseToken  int64  `json:",omitempty"`
}

func runLookup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newClaimFlags("lookup", lookupUsage, "the consumer whose claims to show (required)", stdout)
	asJSON := f.Bool("json", false, "print a JSON array, one object per id")
	raw, ids, err := f.parse(args)
	if err != nil {
		return err
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		infos, err := s.Lookup(ctx, *f.consumer, ids)
		if err != nil {
			return err
		}
		if *asJSON {
			out := make([]claimJSON, len(infos))
			for i, in := range infos {
				out[i] = claimJSON{ID: in.ID, Claimed: in.Claimed, Fingerprint: in.Fingerprint}
				if in.Claimed {
					out[i].At = in.At.UTC().Format(time.RFC3339Nano)
				}
				if !in.LeaseUntil.IsZero() {
					out[i].LeaseUntil, out[i].LeaseToken = in.LeaseUntil.UTC().Format(time.RFC3339Nano), in.LeaseToken
				}
			}
			return writeJSON(stdout, out)
		}
		claimed, leased := 0, 0
		for _, in := range infos {
			if in.Claimed {
				claimed++
			}
			if !in.LeaseUntil.IsZero() {
				leased++
			}
		}
		fmt.Fprintf(stdout, "consumer %s in %s on %s: %d of %d ids claimed", *f.consumer, s.Table(), redact.URL(raw), claimed, len(infos))
		if leased > 0 {
			fmt.Fprintf(stdout, ", %d in progress", leased)
		}
		fmt.Fprintln(stdout)
		tw := newTable(stdout, "ID\tCLAIMED\tAT\tFINGERPRINT\tLEASE")
		for _, in := range infos {
			lease := "-"
			if !in.LeaseUntil.IsZero() {
				lease = fmt.Sprintf("in progress until %s, token %d", in.LeaseUntil.UTC().Format(time.RFC3339), in.LeaseToken)
			}
			if !in.Claimed {
				fmt.Fprintf(tw, "%s\tno\t-\t-\t%s\n", in.ID, lease)
				continue
			}
			fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%s\n", in.ID, in.At.UTC().Format(time.RFC3339), cmp.Or(in.Fingerprint, "(none)"), lease)
		}
		return tw.Flush()
	})
}

// listIDs joins the first max ids, saying how many more there are.
func listIDs(ids []string, max int) string {
	if len(ids) <= max {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:max], ", "), len(ids)-max)
}

const forgetUsage = `Usage: idemq forget --store URL --consumer NAME --yes ID...

Deletes the consumer's claims of the given message ids, so that those
messages are applied again when they are delivered or replayed: on purpose,
for a message whose effect was undone or lost. Without --yes it only says
what it would do (and exits 2). It prints each id and whether it was
claimed, and the number of claims removed. Put ids that start with '-'
after "--".

Forgetting the claim of a message whose effect still stands lets its next
delivery apply the effect twice.
`

func runForget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newClaimFlags("forget", forgetUsage, "the consumer whose claims to delete (required)", stdout)
	yes := f.Bool("yes", false, "delete the claims (required: without it nothing is deleted)")
	raw, ids, err := f.parse(args)
	if err != nil {
		return err
	}
	if !*yes {
		return cli.Usagef("would delete the claims of consumer %s for %d ids (%s) on %s, so their messages apply again: pass --yes to do it",
			*f.consumer, len(ids), listIDs(ids, 10), redact.URL(raw))
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		// What was there, to report each id; the count Forget returns is
		// what was removed.
		before, err := s.Lookup(ctx, *f.consumer, ids)
		if errors.Is(err, errors.ErrUnsupported) {
			before, err = nil, nil
		}
		if err != nil {
			return err
		}
		n, err := s.Forget(ctx, *f.consumer, ids)
		if err != nil {
			return err
		}
		for i, id := range ids {
			switch {
			case before == nil:
				fmt.Fprintf(stdout, "%s: forgotten if it was claimed\n", id)
			case before[i].Claimed:
				fmt.Fprintf(stdout, "%s: forgot the claim of %s\n", id, before[i].At.UTC().Format(time.RFC3339))
			default:
				fmt.Fprintf(stdout, "%s: was not claimed\n", id)
			}
		}
		fmt.Fprintf(stdout, "forgot %d claims of consumer %s in %s on %s\n", n, *f.consumer, s.Table(), redact.URL(raw))
		return nil
	})
}
