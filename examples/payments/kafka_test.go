package main

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// kafkaCluster returns the broker list: IDEMQ_KAFKA_URL's hosts when set
// (a real cluster, whose topics the test must be allowed to create), else
// a fresh in-process kfake cluster speaking the Kafka protocol on a
// loopback port (the service, a separate process, connects to it over
// TCP), closed when the test ends.
func kafkaCluster(t *testing.T, topics ...string) string {
	t.Helper()
	if u := os.Getenv("IDEMQ_KAFKA_URL"); u != "" {
		t.Skip("IDEMQ_KAFKA_URL is set: this test creates its topics only on the in-process kfake cluster")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return strings.Join(c.ListenAddrs(), ",")
}

// TestKillAndRestartKafkaPostgres kills the service twice, not three times:
// each restart waits for the group to drop the killed member, which takes
// the adapter's 30s session timeout (kafka:// URLs cannot lower it yet).
func TestKillAndRestartKafkaPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	topic := "payments-" + randomHex(4)
	addrs := kafkaCluster(t, topic, topic+".dlq")
	runKillAndRestart(t, killRun{
		broker: "kafka://" + addrs + "/" + topic + "?group=payments", store: store, tables: prefix, ledger: l,
		messages: killMessages(t), duplicates: 0.2, kills: 2, batch: 20, concurrency: 2,
	})
}
