package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/idemq/idemq/admin"
	_ "github.com/idemq/idemq/brokers/memory" // mem://
	"github.com/idemq/idemq/core"
)

// A source opened from configuration, logging through the service's own
// logger: its level and handler apply to the adapter's warnings
// (reconnects, receive errors, failed settlements) too.
func ExampleOpenSource() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	src, err := core.OpenSource(context.Background(), "mem://payments?visibility=1m", core.WithAdapterLogger(logger))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()

	_, err = core.OpenSource(context.Background(), "mem://payments?visibilty=1m")
	fmt.Println(err)
	// Output:
	// idemq: opening broker mem://payments?visibilty=1m: mem URL: unknown parameter "visibilty" (did you mean visibility?); known: broker, visibility
}

// A service's own operator endpoint: the messages a deploy dead-lettered
// for one cause are sent back to the queue they came from, once the fix is
// out. The URL is the consumer's source URL; its adapter's package is
// imported, as for OpenSource.
func ExampleOpenDeadLetters() {
	ctx := context.Background()
	q, err := admin.OpenDeadLetters(ctx, os.Getenv("PAYMENTS_BROKER_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer q.Close()
	badDeploy := func(p *admin.Parked) bool { return strings.Contains(p.Cause, "unknown currency") }
	n, err := admin.Redrive(ctx, q, badDeploy, nil)
	fmt.Printf("redrove %d from %s: %v\n", n, q.Name(), err)
}
