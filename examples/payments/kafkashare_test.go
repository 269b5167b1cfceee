package main

import (
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestKillAndRestartKafkaSharePostgres kills the service three times while
// it consumes a three-partition topic in a Kafka share group (kfake; records
// locked for 3s). What a killed run held comes back once its lock lapses,
// to be decided Duplicate or applied once.
func TestKillAndRestartKafkaSharePostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	topic := "payments-" + randomHex(4)
	addrs := servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-topics", topic+":3,"+topic+".dlq:1",
		"-config", "group.share.record.lock.duration.ms=3000",
		"-config", "share.record.lock.sweep.interval.ms=100",
		"-config", "group.share.heartbeat.interval.ms=500",
		"-config", "group.share.session.timeout.ms=6000")
	runKillAndRestart(t, killRun{
		broker:    "kafka+share://" + addrs + "/" + topic + "?group=payments-" + randomHex(3),
		publishTo: "kafka://" + addrs + "/" + topic + "?group=publisher",
		store:     store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
}
