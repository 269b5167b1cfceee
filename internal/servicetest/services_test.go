package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestDeleteQueuesAtCleanup(t *testing.T) {
	u := RabbitMQURL(t)
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := make([]byte, 5)
	rand.Read(b)
	q := "idemq-servicetest-" + hex.EncodeToString(b)
	t.Run("declare", func(t *testing.T) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		for _, n := range []string{q, q + ".dlq"} { // no .retry: a missing one is passed over
			if _, err := ch.QueueDeclare(n, false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		DeleteQueuesAtCleanup(t, u, q)
	})
	for _, n := range []string{q, q + ".dlq"} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclarePassive(n, false, false, false, false, nil); err == nil {
			ch.QueueDelete(n, false, false, false)
			t.Errorf("queue %s still there after the cleanup", n)
		}
		ch.Close()
	}
}

// StartFauxqs runs the emulator the SQS adapter's tests install.
func TestStartFauxqs(t *testing.T) {
	const dir = "../../brokers/sqs/internal/fauxqs"
	f, err := StartFauxqs(dir)
	if err != nil {
		Unavailable(t, "cannot start fauxqs (run `npm ci` in brokers/sqs/internal/fauxqs): %v", err)
	}
	defer f.Stop()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, f.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("fauxqs at %s: %v", f.URL, err)
	}
	resp.Body.Close()
	f.Stop()
	f.Stop() // twice is fine
	select {
	case <-f.done:
	default:
		t.Fatal("fauxqs still running after Stop")
	}
}

func TestStartFauxqsNotInstalled(t *testing.T) {
	if _, err := StartFauxqs(t.TempDir()); err == nil {
		t.Fatal("started from an empty folder")
	}
}

// StartKfake builds and runs bench/cmd/kfake: the brokers answer Kafka
// metadata requests with the seeded topic, and are gone once the test
// that started them has ended.
func TestStartKfake(t *testing.T) {
	var addrs []string
	t.Run("run", func(t *testing.T) {
		addr := StartKfake(t, "-brokers", "2", "-topics", "seeded:3", "-auto-create=false")
		addrs = strings.Split(addr, ",")
		if len(addrs) != 2 {
			t.Fatalf("addresses %q: want two brokers", addr)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		md, err := kafkaAdmin(t, addr).Metadata(ctx, "seeded")
		if err != nil {
			t.Fatalf("metadata: %v", err)
		}
		if len(md.Brokers) != 2 || len(md.Topics) != 1 || len(md.Topics["seeded"].Partitions) != 3 {
			t.Fatalf("metadata: brokers %v, topics %+v; want 2 brokers and seeded with 3 partitions", md.Brokers, md.Topics)
		}
	})
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("broker %s still accepts connections after the test ended", a)
		}
	}
}

// A kfake that refuses its flags fails NewKfake with kfake's own message,
// which shows no password.
func TestNewKfakeBadFlags(t *testing.T) {
	const secret = "Kf-S3cret"
	k, err := NewKfake("-sasl", "GSSAPI:user:"+secret)
	if errors.Is(err, ErrNoKfake) {
		Unavailable(t, "%v", err)
	}
	if err == nil {
		k.Stop()
		t.Fatal("started with an unknown SASL mechanism")
	}
	if !strings.Contains(err.Error(), "mechanism must be") || strings.Contains(err.Error(), secret) {
		t.Fatalf("error %q: want kfake's message, without the password", err)
	}
}
