package main

import (
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestKillAndRestartKafkaPostgres kills the service three times. Each restart
// waits for the group to drop the killed member: the session timeout, 6s by
// default.
func TestKillAndRestartKafkaPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	runKillAndRestart(t, onKafka(t, killRun{
		store: store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	}))
}

// onKafka points r at a fresh three-partition topic and consumer group.
func onKafka(t *testing.T, r killRun) killRun {
	topic := "payments-" + randomHex(4)
	addrs := servicetest.KafkaTopics(t, 3, topic)
	r.broker = "kafka://" + addrs + "/" + topic + "?group=payments-" + randomHex(3)
	return r
}
