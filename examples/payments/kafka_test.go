package main

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestKillAndRestartKafkaPostgres kills the service three times. The
// service is a static member (instance_id): each restart takes its
// partitions back at once, without waiting for the killed member's session
// to time out.
func TestKillAndRestartKafkaPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	r := onKafka(t, killRun{
		store: store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
	r.broker = kafkaReplica(r.broker, 0)
	runKillAndRestart(t, r)
}

// TestKillAndRestartKafkaConsumerProtocolPostgres is the same on a KIP-848
// group (group_protocol=consumer), on kfake.
func TestKillAndRestartKafkaConsumerProtocolPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	r := onKafkaConsumerProtocol(t, killRun{
		store: store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
	r.broker = kafkaReplica(r.broker, 0)
	runKillAndRestart(t, r)
}

// onKafka points r at a fresh three-partition topic and consumer group.
func onKafka(t *testing.T, r killRun) killRun {
	topic := "payments-" + randomHex(4)
	addrs := servicetest.KafkaTopics(t, 3, topic)
	r.broker = "kafka://" + addrs + "/" + topic + "?group=payments-" + randomHex(3)
	return r
}

// onKafkaConsumerProtocol points r at a fresh three-partition topic of a
// kfake of its own, read by a KIP-848 group (group_protocol=consumer) whose
// members heartbeat every 500ms.
func onKafkaConsumerProtocol(t *testing.T, r killRun) killRun {
	topic := "payments-" + randomHex(4)
	addrs := servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-topics", topic+":3,"+topic+".dlq:1",
		"-config", "group.consumer.heartbeat.interval.ms=500", "-config", "group.consumer.session.timeout.ms=6000")
	r.broker = "kafka://" + addrs + "/" + topic + "?group_protocol=consumer&group=payments-" + randomHex(3)
	return r
}

// kafkaReplica gives replica slot its own instance id, kept across its
// restarts as a StatefulSet keeps a pod's ordinal: a static member.
func kafkaReplica(broker string, slot int) string {
	return withQuery(broker, "instance_id", fmt.Sprintf("payments-%d", slot))
}
