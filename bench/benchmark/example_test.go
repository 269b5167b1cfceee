package benchmark_test

import (
	"context"
	"log"
	"os"

	"github.com/idemq/idemq/bench/benchmark"
)

// Run the default configurations against local RabbitMQ and Postgres and
// print the table; idemq-bench does the same from the command line.
func ExampleRun() {
	rep, err := benchmark.Run(context.Background(), benchmark.Config{
		Broker:   "amqp://guest:guest@127.0.0.1:5672/?queue=idemq-bench",
		Store:    "postgres://postgres@127.0.0.1:5432/test",
		N:        50_000, // plus 20% duplicates: 60,000 deliveries per run
		Repeat:   3,
		Progress: os.Stderr,
	})
	if err != nil {
		log.Fatal(err)
	}
	rep.WriteTable(os.Stdout)
	if err := rep.WritePNG("bench.png"); err != nil {
		log.Fatal(err)
	}
}

// Compare idemq with hand-written consumers for another broker and store:
// here Kafka (go run ./cmd/kfake -addr 127.0.0.1:9092, in the bench
// module, serves one) into
// MariaDB, and SQS (an emulator's endpoint) into Postgres with batches of
// 10, the most SQS receives and deletes at once.
func ExampleRun_otherBrokersAndStores() {
	ctx := context.Background()
	kafka, err := benchmark.Run(ctx, benchmark.Config{
		Broker: "kafka://127.0.0.1:9092/idemq-bench?partitions=8",
		Store:  "mysql://root@127.0.0.1:3306/test",
		N:      20_000,
	})
	if err != nil {
		log.Fatal(err)
	}
	kafka.WriteTable(os.Stdout)
	sqs, err := benchmark.Run(ctx, benchmark.Config{
		Broker:    "sqs://test:test@idemq-bench?endpoint=http://127.0.0.1:9324&region=us-east-1",
		Store:     "postgres://postgres@127.0.0.1:5432/test",
		N:         20_000,
		BatchSize: 10,
	})
	if err != nil {
		log.Fatal(err)
	}
	sqs.WriteTable(os.Stdout)
}
