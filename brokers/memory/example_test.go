package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// A broker with a seeded fault plan: publish, receive, settle through the
// Subscription's driver methods (what a Consumer calls), and wait for the
// queue to drain. Services hand the Subscription to core.New instead.
func Example() {
	b, err := memory.NewBroker(memory.WithSeed(42), memory.WithVisibilityTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer b.Close()
	ctx := context.Background()

	sub, err := b.Subscribe("payments")
	if err != nil {
		panic(err)
	}
	defer sub.Close()

	_ = b.Publish(ctx, "payments",
		&driver.Message{ID: "pay-1", Body: []byte(`{"amount":10}`)},
		&driver.Message{ID: "pay-2", Body: []byte(`{"amount":-1}`)},
	)
	for b.Len("payments") > 0 {
		ms, err := sub.Receive(ctx, 10)
		if err != nil {
			panic(err)
		}
		for _, m := range ms {
			one := []*driver.Message{m}
			switch {
			case m.ID == "pay-2" && m.Attempt < 2:
				_ = sub.Retry(ctx, one, 10*time.Millisecond) // transient failure: try again later
			case m.ID == "pay-2":
				_ = sub.DeadLetter(ctx, one, []error{core.Permanent(errors.New("negative amount"))})
			default:
				_ = sub.Ack(ctx, one)
			}
			fmt.Printf("%s attempt %d\n", m.ID, m.Attempt)
		}
	}
	for _, dl := range b.DeadLetters("payments") {
		fmt.Printf("dead letter %s: %v\n", dl.Message.ID, dl.Cause)
	}
	st := b.Stats("payments")
	fmt.Printf("delivered %d, acked %d, retried %d, dead-lettered %d\n", st.Delivered, st.Acked, st.Retried, st.DeadLettered)
	// Output:
	// pay-1 attempt 1
	// pay-2 attempt 1
	// pay-2 attempt 2
	// dead letter pay-2: permanent: negative amount
	// delivered 3, acked 1, retried 1, dead-lettered 1
}

// Faults make the broker misbehave the way real ones do, reproducibly under
// the seed: here every ack is lost, so the message comes back once its
// visibility timeout expires.
func ExampleBroker_SetFaults() {
	b, _ := memory.NewBroker(memory.WithVisibilityTimeout(20 * time.Millisecond))
	defer b.Close()
	ctx := context.Background()
	sub, _ := b.Subscribe("q")
	_ = b.Publish(ctx, "q", &driver.Message{ID: "a"})

	_ = b.SetFaults(memory.Faults{LoseAck: 1})
	ms, _ := sub.Receive(ctx, 1)
	fmt.Println("ack:", sub.Ack(ctx, ms)) // nil, yet the broker never got it

	_ = b.SetFaults(memory.Faults{})
	ms, _ = sub.Receive(ctx, 1) // redelivered after the visibility timeout
	fmt.Println("redelivered:", ms[0].ID, "attempt", ms[0].Attempt)
	_ = sub.Ack(ctx, ms)
	fmt.Println("idle:", b.WaitIdle(ctx, "q"))
	// Output:
	// ack: <nil>
	// redelivered: a attempt 2
	// idle: <nil>
}

// Crash simulates a consumer dying between its commit and its ack: what it
// held is redelivered at once to the next subscriber.
func ExampleSubscription_Crash() {
	b, _ := memory.NewBroker()
	defer b.Close()
	ctx := context.Background()
	_ = b.Publish(ctx, "q", &driver.Message{ID: "a"})

	first, _ := b.Subscribe("q")
	ms, _ := first.Receive(ctx, 1)
	first.Crash()
	fmt.Println("late ack:", errors.Is(first.Ack(ctx, ms), memory.ErrCrashed))

	second, _ := b.Subscribe("q")
	ms, _ = second.Receive(ctx, 1)
	fmt.Println(ms[0].ID, "attempt", ms[0].Attempt)
	// Output:
	// late ack: true
	// a attempt 2
}
