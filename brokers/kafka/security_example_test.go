package kafka_test

import (
	"context"
	"crypto/tls"
	"log"
	"os"

	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idemq/idemq/brokers/kafka"
	"github.com/idemq/idemq/core"
)

// A source on a cluster that wants TLS and SCRAM, from configuration: the
// password travels in the URL (percent-encoded), never in logs or errors.
// The same from code: WithTLS and WithSASL.
func ExampleWithSASL() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "kafka://billing:s3cret@kafka-1:9093,kafka-2:9093/payments?group=billing&tls=true&ca_file=/etc/kafka/ca.pem&sasl=scram-sha-512")
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()

	mech := scram.Auth{User: "billing", Pass: os.Getenv("KAFKA_PASSWORD")}.AsSha512Mechanism()
	src2, err := kafka.Open(ctx, "kafka://kafka-1:9093,kafka-2:9093/payments?group=billing",
		kafka.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}), kafka.WithSASL(mech))
	if err != nil {
		log.Fatal(err)
	}
	defer src2.Close()
}
