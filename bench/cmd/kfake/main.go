// Command kfake serves an in-process Kafka cluster
// (github.com/twmb/franz-go/pkg/kfake) on a loopback port, so that examples,
// tests and idemq-bench can run against kafka://127.0.0.1:PORT/… without
// Docker or a JVM.
//
// It is a development aid, not a production broker: everything is kept in
// memory, nothing is replicated, and the data is gone when it stops.
//
// Usage:
//
//	go run ./cmd/kfake -addr 127.0.0.1:9092 -topics payments:3,payments.dlq:1
//
// It serves until SIGINT or SIGTERM. -topics creates topics up front
// (name:partitions, comma-separated; partitions default to 1); other topics
// are created on first use when -auto-create is on (the default).
// -min-session-timeout lowers Kafka's 6s minimum consumer group session
// timeout for quick rebalances.
//
// Then point anything at it by URL, for example:
//
//	kafka://127.0.0.1:9092/payments?group=billing   (core.OpenSource)
//	IDEMQ_KAFKA_URL=kafka://127.0.0.1:9092 go test ./brokers/kafka/
//
// (the brokers/kafka tests start their own in-process kfake when
// IDEMQ_KAFKA_URL is unset).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kfake", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9092", "loopback host:port to listen on")
	topics := fs.String("topics", "", "topics to create, name:partitions[,name:partitions...]")
	auto := fs.Bool("auto-create", true, "create unknown topics on first use (with -partitions partitions)")
	parts := fs.Int("partitions", 1, "partitions of auto-created topics")
	minSession := fs.Duration("min-session-timeout", 6*time.Second, "smallest consumer group session timeout accepted (Kafka's default 6s; lower it for fast rebalances in tests)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts, err := options(*addr, *topics, *auto, *parts)
	if err != nil {
		return err
	}
	if *minSession <= 0 {
		return fmt.Errorf("-min-session-timeout %v: must be positive", *minSession)
	}
	opts = append(opts, kfake.GroupMinSessionTimeout(*minSession))
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("kfake: serving Kafka on %s (development aid: in memory, not a production broker); Ctrl-C stops it\n",
		strings.Join(c.ListenAddrs(), ","))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Println("kfake: stopping")
	return nil
}

// options turns the flags into kfake options. The listener must be on a
// loopback address: kfake has no authentication configured here.
func options(addr, topics string, auto bool, parts int) ([]kfake.Opt, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-addr %q: host must be a loopback address (this is a development aid)", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("-addr %q: bad port", addr)
	}
	if parts < 1 {
		return nil, fmt.Errorf("-partitions %d: must be at least 1", parts)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DefaultNumPartitions(parts),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
	}
	if auto {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	specs, err := parseTopics(topics)
	if err != nil {
		return nil, err
	}
	for _, s := range specs {
		opts = append(opts, kfake.SeedTopics(s.partitions, s.name))
	}
	return opts, nil
}

type topicSpec struct {
	name       string
	partitions int32
}

// parseTopics parses "a:3,b,c:1".
func parseTopics(s string) ([]topicSpec, error) {
	var out []topicSpec
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, n, hasN := strings.Cut(part, ":")
		if name == "" {
			return nil, fmt.Errorf("-topics %q: empty topic name", s)
		}
		p := 1
		if hasN {
			v, err := strconv.Atoi(n)
			if err != nil || v < 1 || v > 10000 {
				return nil, fmt.Errorf("-topics: %q: partitions must be 1..10000", part)
			}
			p = v
		}
		out = append(out, topicSpec{name, int32(p)})
	}
	if len(out) == 0 {
		return nil, errors.New("-topics: no topics")
	}
	return out, nil
}
