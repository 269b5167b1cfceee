package hostlist

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestSplit(t *testing.T) {
	l, err := Split("amqps://u:p%2Cw@h1:5671,h2,[::1]:5673/vh?heartbeat=5")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"amqps://u:p%2Cw@h1:5671/vh?heartbeat=5", "amqps://u:p%2Cw@h2/vh?heartbeat=5", "amqps://u:p%2Cw@[::1]:5673/vh?heartbeat=5"}
	if strings.Join(l.URLs, " ") != strings.Join(want, " ") {
		t.Errorf("node urls = %q, want %q", l.URLs, want)
	}
	if strings.Join(l.Hosts, " ") != "h1:5671 h2 [::1]:5673" || l.Host(2) != "[::1]:5673" {
		t.Errorf("hosts = %q", l.Hosts)
	}
	for raw, host := range map[string]string{"amqp://u:p@h:5672/vh": "h:5672", "no scheme": "#1", "amqp://u:p@h:notaport/": "#1"} {
		l, err := Split(raw)
		if err != nil || len(l.URLs) != 1 || l.URLs[0] != raw || l.Host(0) != host {
			t.Errorf("Split(%q) = %+v, %v; want the URL whole, host %q", raw, l, err, host)
		}
	}
	for raw, want := range map[string]string{
		"amqp://u:secret@h1:5672,,h3/":     "node 2 of 3: empty host",
		"amqp://u:secret@h1:5672,h2:56x2/": `node 2 of 2: "h2:56x2": port "56x2" is not a number`,
		"amqp://u:secret@h1,h2:99999/":     `port "99999" is not a number in 1..65535`,
		"amqp://u:secret@h1:5672,:5673/":   `node 2 of 2: ":5673": empty host`,
		"amqp://u:secret@h1:5672,h2:/":     `"h2:": port "" is not a number`,
		"amqp://u:sec,ret/x@h1:5672,h2/":   "node 1 of 2: not a host:port (not shown",
		"amqps://u:secret@h1:5672,[::1/":   `no ']'`,
		"amqp://h1,a b:1/":                 "not a host:port",
	} {
		_, err := Split(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Split(%q) = %v, want an error with %q", raw, err, want)
			continue
		}
		for _, secret := range []string{"secret", "sec,ret"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Split(%q) error shows the password: %v", raw, err)
			}
		}
	}
}

// The Dialer tries each node once from a random start, moves on at once
// from a failed node, starts after the node it reached, and names each
// node's failure without the password.
func TestCheckHostPort(t *testing.T) {
	for h, want := range map[string]string{"h": "", "h:1": "", "[::1]": "", "[::1]:65535": "", "[::1]x": `"x" after the IPv6 address`, "[]:1": "empty host", "h:0": "not a number in 1..65535"} {
		err := CheckHostPort(h)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("CheckHostPort(%q) = %v, want %q", h, err, want)
		}
	}
}

func TestDialerRotates(t *testing.T) {
	l, err := Split("amqp://u:secret@a:1,b:2,c:3/")
	if err != nil {
		t.Fatal(err)
	}
	var tried []string
	down := map[string]bool{}
	d := NewDialer(l, func(_ context.Context, u string) (string, error) {
		tried = append(tried, u)
		if down[u] {
			return "", errors.New("refused by " + u)
		}
		return u, nil
	})
	first, err := d.Dial(context.Background())
	if err != nil || d.Last() != strings.TrimSuffix(strings.TrimPrefix(first, "amqp://u:secret@"), "/") {
		t.Fatalf("Dial = %q, %v; Last %q", first, err, d.Last())
	}
	down[first] = true
	tried = nil
	second, err := d.Dial(context.Background())
	if err != nil || second == first || len(tried) != 1 {
		t.Fatalf("after %q the next Dial went to %q (tried %q), %v: want the next node at once", first, second, tried, err)
	}
	for _, u := range l.URLs {
		down[u] = true
	}
	tried = nil
	_, err = d.Dial(context.Background())
	if err == nil || len(tried) != 3 || tried[0] == second {
		t.Fatalf("every node down: tried %q, %v", tried, err)
	}
	for _, h := range l.Hosts {
		if !strings.Contains(err.Error(), "node "+h+": refused by") {
			t.Errorf("error %q does not name node %s", err, h)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error shows the password: %v", err)
	}
}

func TestDialerStopsWithTheContext(t *testing.T) {
	l, _ := Split("amqp://a:1,b:2,c:3/")
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	d := NewDialer(l, func(ctx context.Context, u string) (int, error) {
		n++
		cancel()
		return 0, ctx.Err()
	})
	if _, err := d.Dial(ctx); !errors.Is(err, context.Canceled) || n != 1 {
		t.Errorf("Dial after cancel: %v after %d tries, want context.Canceled after 1", err, n)
	}
}

func TestAwait(t *testing.T) {
	c, err := Await(context.Background(), func() (int, error) { return 7, nil }, func(int) { t.Error("released a connection returned in time") })
	if c != 7 || err != nil {
		t.Errorf("Await = %d, %v", c, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	var released atomic.Int32
	late := make(chan struct{})
	_, err = Await(ctx, func() (int, error) { <-late; return 8, nil }, func(c int) { released.Store(int32(c)) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Await past its context: %v", err)
	}
	close(late)
	deadline := time.Now().Add(5 * time.Second)
	for released.Load() != 8 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if released.Load() != 8 {
		t.Error("the late connection was not released")
	}
}
