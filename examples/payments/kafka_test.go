package main

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/servicetest"
)

// kafkaCluster returns the broker list with topics created (3 partitions
// each): on IDEMQ_KAFKA_URL's hosts when it is set (a real cluster; the
// topics are deleted when the test ends; unreachable skips, or fails with
// IDEMQ_REQUIRE_SERVICES=1), else on a fresh kfake cluster
// (bench/cmd/kfake, a process of its own: servicetest.StartKfake) speaking
// the Kafka protocol on a loopback port (the service, a separate process,
// connects to it over TCP), stopped when the test ends. Like a Kafka
// broker's defaults, kfake then creates no topic on first use and accepts
// group session timeouts of 6s and more.
func kafkaCluster(t *testing.T, topics ...string) string {
	t.Helper()
	raw := os.Getenv("IDEMQ_KAFKA_URL")
	if raw == "" {
		return servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false",
			"-topics", strings.Join(topics, ":3,")+":3")
	}
	hosts := raw
	if u, err := url.Parse(raw); err == nil && u.Scheme == "kafka" {
		hosts = u.Host
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := &kafkago.Client{Addr: kafkago.TCP(strings.Split(hosts, ",")...)}
	if _, err := cl.Metadata(ctx, &kafkago.MetadataRequest{}); err != nil {
		unavailable(t, "IDEMQ_KAFKA_URL", raw, err)
	}
	var cfgs []kafkago.TopicConfig
	for _, name := range topics {
		cfgs = append(cfgs, kafkago.TopicConfig{Topic: name, NumPartitions: 3, ReplicationFactor: 1})
	}
	resp, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for name, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl.DeleteTopics(ctx, &kafkago.DeleteTopicsRequest{Topics: topics})
	})
	return hosts
}

// TestKillAndRestartKafkaPostgres kills the service three times. Each restart
// waits for the group to drop the killed member, so the URL lowers the
// session timeout to 6s (Kafka's smallest by default).
func TestKillAndRestartKafkaPostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	topic := "payments-" + randomHex(4)
	addrs := kafkaCluster(t, topic, topic+".dlq")
	runKillAndRestart(t, killRun{
		broker: "kafka://" + addrs + "/" + topic + "?group=payments-" + randomHex(3) + "&session_timeout=6s&heartbeat_interval=1s",
		store:  store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
}
