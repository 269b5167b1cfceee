package security

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// need skips t, or fails it when IDEMQ_REQUIRE_SERVICES=1, when err says a
// service is unreachable.
func need(t testing.TB, variable, url string, err error) {
	t.Helper()
	if err != nil {
		servicetest.Unavailable(t, "service unreachable at %s=%s: %v", variable, url, err)
	}
}

// amqpURL returns IDEMQ_AMQP_URL (default the local broker), skipping
// when it is unreachable.
func amqpURL(t testing.TB) string {
	t.Helper()
	return servicetest.RabbitMQURL(t)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
