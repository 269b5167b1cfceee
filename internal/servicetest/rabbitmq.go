package servicetest

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteQueuesAtCleanup deletes, when t ends, each named queue on the
// broker at url together with the dead-letter (".dlq") and retry
// (".retry") queues the rabbitmq adapter declares after it. Queues that
// do not exist are passed over; an unreachable broker is only logged.
func DeleteQueuesAtCleanup(t testing.TB, url string, queues ...string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Logf("cleanup: deleting queues %v: %v", queues, err)
			return
		}
		defer conn.Close()
		for _, q := range queues {
			for _, n := range []string{q, q + ".dlq", q + ".retry"} {
				// A failed delete closes the channel: one per queue.
				ch, err := conn.Channel()
				if err != nil {
					return
				}
				ch.QueueDelete(n, false, false, false)
				ch.Close()
			}
		}
	})
}
