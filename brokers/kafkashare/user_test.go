package kafkashare

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/servicetest"
)

// Records produced with kcat (librdkafka), as a service in another
// language would: the id comes from the message-id header, the key and
// body as written; a record kcat sent without the header is refused an
// id (the Consumer dead-letters it).
func TestProducedWithKcat(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		servicetest.Unavailable(t, "kcat (Debian package kcat) is not installed: %v", err)
	}
	bs := cluster(t, 5)
	topic := newTopic(t, bs, 1)
	for _, m := range []struct{ id, key, body string }{{"k-1", "acct-1", `{"n":1}`}, {"k-2", "acct-2", `{"n":2}`}, {"", "acct-3", `{"n":3}`}} {
		args := []string{"-P", "-b", bs, "-t", topic, "-k", m.key}
		if m.id != "" {
			args = append(args, "-H", "message-id="+m.id)
		}
		cmd := exec.Command(kcat, args...)
		cmd.Stdin = strings.NewReader(m.body + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat %v: %v\n%s", args, err, out)
		}
	}
	s := open(t, sourceURL(bs, topic, "g-"+randomHex(3), ""))
	got := map[string]*driver.Message{}
	for _, d := range receive(t, s, 3, 20*time.Second) {
		m := d.Message()
		got[m.Key] = m
		if err := d.Ack(context.Background()); err != nil {
			t.Errorf("Ack: %v", err)
		}
	}
	if m := got["acct-1"]; m == nil || m.ID != "k-1" || string(m.Body) != `{"n":1}` {
		t.Errorf("acct-1: %+v", m)
	}
	if m := got["acct-2"]; m == nil || m.ID != "k-2" {
		t.Errorf("acct-2: %+v", m)
	}
	if m := got["acct-3"]; m == nil || m.ID != "" {
		t.Errorf("acct-3 (no header): %+v, want no id", m)
	}
}

// A Retry with a delay keeps the record locked to its member until the
// delay has passed: no copy comes sooner, one comes after, as attempt 2.
func TestRetryWaitsOutItsDelay(t *testing.T) {
	s, first, url := slowMessage(t)
	other := open(t, url)
	const delay = time.Second
	began := time.Now()
	if err := first.Retry(context.Background(), delay); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type got struct {
		d   driver.Delivery
		err error
	}
	ch := make(chan got, 2)
	for _, src := range []*Source{s, other} {
		go func() {
			d, err := src.Receive(ctx)
			ch <- got{d, err}
		}()
	}
	g := <-ch
	if g.err != nil {
		t.Fatalf("Receive after Retry: %v", g.err)
	}
	if waited := time.Since(began); waited < delay*9/10 {
		t.Errorf("the copy came %v after Retry(%v)", waited, delay)
	}
	if m := g.d.Message(); m.ID != "slow" || m.Attempt != 2 {
		t.Errorf("copy: %s attempt %d, want slow attempt 2", m.ID, m.Attempt)
	}
	if err := g.d.Ack(context.Background()); err != nil {
		t.Errorf("Ack of the copy: %v", err)
	}
	cancel()
	<-ch
}

// A dead letter whose copy cannot be produced (its topic does not exist
// and the cluster creates none) fails and releases the record: it comes
// back, and nothing was parked or rejected.
func TestDeadLetterCopyFailsReleases(t *testing.T) {
	s, first, _ := slowMessage(t, WithDeadLetterTopic("no-such-topic-"+randomHex(3)))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := first.DeadLetter(ctx, errors.New("poison"))
	if err == nil || !strings.Contains(err.Error(), "released for redelivery") {
		t.Fatalf("DeadLetter: %v, want an error saying the record was released", err)
	}
	again := receive(t, s, 1, 20*time.Second)[0]
	if m := again.Message(); m.ID != "slow" || m.Attempt != 2 {
		t.Fatalf("after the failed dead letter: %s attempt %d, want slow attempt 2", m.ID, m.Attempt)
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Errorf("Ack: %v", err)
	}
}
