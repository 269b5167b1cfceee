package core_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	_ "github.com/idemq/idemq/brokers/memory" // mem://
	"github.com/idemq/idemq/core"
)

// A source opened from configuration, logging through the service's own
// logger: its level and handler apply to the adapter's warnings
// (reconnects, receive errors, failed settlements) too.
func ExampleOpenSource() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	src, err := core.OpenSource(context.Background(), "mem://payments?window=50", core.WithAdapterLogger(logger))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()

	_, err = core.OpenSource(context.Background(), "mem://payments?windw=50")
	fmt.Println(err)
	// Output:
	// idemq: opening broker mem://payments?windw=50: mem URL: unknown parameter "windw" (known: broker, visibility, window)
}
