package main

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestKillAndRestartNATSPostgres kills the service three times while it
// consumes a JetStream stream. The killed consumer's unacked messages come
// back once their AckWait passes (5s here), so each restart
// resumes from the durable consumer's state on the server.
func TestKillAndRestartNATSPostgres(t *testing.T) {
	t.Parallel()
	nu := servicetest.NATSURL(t)
	store, prefix, l := postgresStore(t)
	stream := "PAYMENTS_" + strings.ToUpper(randomHex(4))
	servicetest.DeleteStreamsAtCleanup(t, nu, stream, stream+"_DLQ")
	runKillAndRestart(t, killRun{
		broker: nu + "/" + stream + "?consumer=payments&ack_wait=5s&subject=" + strings.ToLower(stream),
		store:  store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
}
