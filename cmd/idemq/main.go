// Command idemq is the operator's tool for idemq's dedup stores and
// outbox tables:
//
//	idemq migrate --store URL                          create the dedup table
//	idemq prune   --store URL --older-than 168h        delete old claims in bounded batches
//	idemq stats   --store URL [--broker URL]           claims per consumer, oldest claim, table size; retention against the broker's horizon
//	idemq lookup  --store URL --consumer C ID…         whether each id is claimed, when, its fingerprint
//	idemq forget  --store URL --consumer C --yes ID…   delete those claims, so the messages apply again
//	idemq dlq list|groups|show|redrive|purge --broker URL [ID…]   a consumer's dead letters: read, group by cause, send back, delete
//	idemq outbox list    --store URL [--key K] [--cause T] [--json]   the outbox's parked rows and their causes
//	idemq outbox redrive --store URL (--id ROW… | --all) [--dry-run]  make parked rows pending again
//	idemq outbox purge   --store URL (--id ROW… | --all) --yes        delete parked rows unpublished
//	idemq outbox stats   --store URL [--json]             pending rows, oldest age, parked rows, keys held back
//	idemq console --store URL --broker CONSUMER=URL… [--listen 127.0.0.1:8089]   the operator's console in the browser
//
// Measuring a broker and store pair is the benchmark's own command,
// idemq-bench, in the bench module (cd bench && go run ./cmd/idemq-bench).
//
// Stores are opened by URL (postgres://…, mysql://…, sqlite://path; ?table=
// names the dedup table, or for idemq outbox the outbox table); brokers by
// a consumer's own source URL: amqp:// (RabbitMQ), kafka:// and
// kafka+share:// (Kafka consumer and share groups), sqs://, pubsub://
// (Google Cloud Pub/Sub), nats:// (JetStream), redis:// (Redis Streams),
// webhook:// (parked requests); mem:// lives in one process and is read
// there. Credentials in URLs never appear in the output.
// `idemq <command> --help` describes each command.
//
// Exit codes, for scripts: 0 success, 1 failure (the store failed, or
// the command was interrupted), 2 usage error (unknown command,
// bad or missing flag).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/middleware/tracing"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// command is one subcommand.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"migrate", "create the dedup table of a store (idempotent)", runMigrate},
		{"prune", "delete claims older than a duration, in bounded batches", runPrune},
		{"stats", "show claims per consumer, the oldest claim and the table size", runStats},
		{"lookup", "show whether message ids are claimed, when, and their fingerprints", runLookup},
		{"forget", "delete the claims of message ids so they apply again (needs --yes)", runForget},
		{"dlq", "list, group, show, redrive or purge a consumer's dead letters", runDLQ},
		{"outbox", "list, redrive, purge parked outbox rows; outbox backlog (outbox --help)", runOutbox},
		{"console", "serve the operator's console in the browser (console --help)", runConsole},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// W3C trace context on whatever the command publishes, continuing the
	// trace it was started in (TRACEPARENT), if any.
	ctx = tracing.InstallPropagator(ctx)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			return run(ctx, []string{args[1], "--help"}, stdout, stderr)
		}
		printUsage(stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, cli.ErrHelp):
			return exitOK
		case errors.As(err, new(cli.UsageError)):
			fmt.Fprintf(stderr, "idemq %s: %v\nRun 'idemq %s --help' for usage.\n", name, err, name)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "idemq %s: %v\n", name, err)
			return exitFailure
		}
	}
	fmt.Fprintf(stderr, "idemq: unknown command %q\n\n", name)
	printUsage(stderr)
	return exitUsage
}

// runSubcommand runs the subcommand of group that args[0] names, among
// subs; usage is the group's own --help text. A usage error names the
// subcommand and where its flags are described.
func runSubcommand(ctx context.Context, group, usage string, subs []command, args []string, stdout, stderr io.Writer) error {
	names := make([]string, len(subs))
	for i, c := range subs {
		names[i] = c.name
	}
	if len(args) == 0 {
		return cli.Usagef("give a subcommand: %s", strings.Join(names, ", "))
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return cli.ErrHelp
	}
	for _, c := range subs {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		if errors.As(err, new(cli.UsageError)) {
			return cli.Usagef("%s: %v (see 'idemq %s %s --help')", c.name, err, group, c.name)
		}
		return err
	}
	return cli.Usagef("unknown subcommand %q (%s)", args[0], strings.Join(names, ", "))
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `idemq: operate idemq's dedup stores, dead letters and outboxes.

Usage: idemq <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Stores are given by URL: postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db,
sqlite://path/to/app.db; ?table=NAME names the dedup table (default processed_messages).
Brokers (stats, dlq, console) by a consumer's own source URL:
  RabbitMQ            amqp://user:pass@host:5672/vhost?queue=Q (amqps:// with TLS)
  Kafka               kafka://host:9092/TOPIC?group=G (consumer groups)
  Kafka share groups  kafka+share://host:9092/TOPIC?group=G
  SQS                 sqs://QUEUE?region=R (dlq= names its dead-letter queue)
  Google Pub/Sub      pubsub://PROJECT/SUBSCRIPTION?topic=T
  NATS JetStream      nats://host:4222/STREAM?consumer=C&subject=S
  Redis Streams       redis://host:6379/STREAM?group=G (rediss:// with TLS)
  Webhooks            webhook://host:port/PATH?park_dir=DIR (parked requests: list, show, purge)
  mem://              in-process only: its dead letters are read in the process that runs it
Credentials never appear in the output.

Exit codes: 0 success, 1 failure, 2 usage error.
Run 'idemq <command> --help' for a command's flags.
`)
}
