package security

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// need skips t, or fails it when IDEMQ_REQUIRE_SERVICES=1, when err says a
// service is unreachable.
func need(t testing.TB, variable, url string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	msg := "service unreachable at " + variable + "=" + url + ": " + err.Error()
	if os.Getenv("IDEMQ_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// amqpURL returns IDEMQ_AMQP_URL (default the local broker), skipping
// when it is unreachable.
func amqpURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("IDEMQ_AMQP_URL")
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.DialConfig(u, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	need(t, "IDEMQ_AMQP_URL", "(hidden)", err)
	conn.Close()
	return u
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
