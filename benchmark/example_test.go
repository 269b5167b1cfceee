package benchmark_test

import (
	"context"
	"log"
	"os"

	"github.com/idemq/idemq/benchmark"
)

// Run the default configurations against local RabbitMQ and Postgres and
// print the table; idemq bench does the same from the command line.
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
