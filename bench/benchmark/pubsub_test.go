package benchmark

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestRunPubSubPostgres runs every configuration on Google's Pub/Sub
// emulator (IDEMQ_PUBSUB_URL, its host:port, or a private one the test
// starts) into Postgres.
func TestRunPubSubPostgres(t *testing.T) {
	pgURL := servicetest.PostgresURL(t)
	servicetest.PubSubEmulator(t) // sets PUBSUB_EMULATOR_HOST
	rep := runSmall(t, "pubsub://idemq-bench/idemq-bench-test", pgURL, 300, 50, allConfigs)
	if !strings.Contains(rep.Machine.Broker, "Pub/Sub emulator") {
		t.Errorf("broker %q", rep.Machine.Broker)
	}
}
