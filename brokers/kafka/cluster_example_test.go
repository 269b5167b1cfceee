package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/internal/servicetest"
)

// exampleCluster gives the examples that run a Kafka cluster's host:port
// list and a topic, with its dead-letter topic topic.dlq, that nothing has
// written to: on the cluster IDEMQ_KAFKA_URL names, a fresh topic, deleted
// by stop; else a kfake of their own (bench/cmd/kfake, started by
// servicetest.NewKfake) with the topic "payments", stopped by stop. An
// example cannot skip: without either, it fails saying what to set.
func exampleCluster() (brokers, topic string, stop func()) {
	raw := os.Getenv(servicetest.KafkaEnv)
	if raw == "" {
		k, err := servicetest.NewKfake("-auto-create=false", "-topics", "payments,payments.dlq")
		if err != nil {
			log.Fatalf("no Kafka for the example: %v (or set %s to a Kafka cluster)", err, servicetest.KafkaEnv)
		}
		return k.Addr, "payments", k.Stop
	}
	hosts := raw
	if u, err := url.Parse(raw); err == nil && u.Scheme == "kafka" {
		hosts = u.Host
	}
	b := make([]byte, 4)
	rand.Read(b)
	topic = "payments-" + hex.EncodeToString(b)
	topics := []string{topic, topic + ".dlq"}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(hosts, ",")...))
	if err != nil {
		log.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.CreateTopics(ctx, 1, 1, nil, topics...)
	if err == nil {
		for _, r := range resp {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				err = r.Err
			}
		}
	}
	if err != nil {
		log.Fatalf("%s: create topics: %v", servicetest.KafkaEnv, err)
	}
	return hosts, topic, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		adm.DeleteTopics(ctx, topics...)
		cl.Close()
	}
}
