package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"testing"

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
