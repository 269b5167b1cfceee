package main

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	s, err := parseFlags([]string{"-addr", "127.0.0.1:0", "-brokers", "3", "-topics", "a:3,b", "-auto-create=false",
		"-min-session-timeout", "100ms", "-sasl", "scram-sha-512:u1:p:w:d", "-sasl", "PLAIN:u2:pw2"})
	if err != nil {
		t.Fatal(err)
	}
	if s.host != "127.0.0.1" || s.port != 0 || s.brokers != 3 || s.autoCreate || s.minSession != 100*time.Millisecond ||
		len(s.topics) != 2 || s.topics[0] != (topicSpec{"a", 3}) || s.topics[1] != (topicSpec{"b", 1}) {
		t.Errorf("parsed %+v", s)
	}
	want := []saslUser{{"SCRAM-SHA-512", "u1", "p:w:d"}, {"PLAIN", "u2", "pw2"}}
	if len(s.users) != 2 || s.users[0] != want[0] || s.users[1] != want[1] {
		t.Errorf("users %+v, want %+v", s.users, want)
	}
	d, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.host != "127.0.0.1" || d.port != 9092 || d.brokers != 1 || !d.autoCreate || d.partitions != 1 ||
		d.minSession != 6*time.Second || d.tlsCert != "" || len(d.users) != 0 || d.watchStdin {
		t.Errorf("defaults %+v", d)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	const secret = "Hidden-S3cret"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", "10.0.0.1:9092"}, "loopback"},
		{[]string{"-addr", "127.0.0.1:x"}, "bad port"},
		{[]string{"-brokers", "0"}, "-brokers 0"},
		{[]string{"-addr", "127.0.0.1:65535", "-brokers", "2"}, "beyond 65535"},
		{[]string{"-partitions", "0"}, "-partitions 0"},
		{[]string{"-min-session-timeout", "0s"}, "must be positive"},
		{[]string{"-tls-cert", "c.pem"}, "go together"},
		{[]string{"-topics", "a:0"}, "partitions must be"},
		{[]string{"-sasl", "GSSAPI:u:" + secret}, "mechanism must be"},
		{[]string{"-sasl", "PLAIN:" + secret}, "MECHANISM:USER:PASSWORD"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		_, err := parseFlags(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%v: the error shows the password: %v", c.args, err)
		}
	}
}

// TestRun serves two brokers on free ports, checks both accept
// connections, and stops when standard input closes (-watch-stdin).
func TestRun(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-addr", "127.0.0.1:0", "-brokers", "2", "-watch-stdin"}, inR, outW)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	if !sc.Scan() {
		t.Fatalf("no output: %v", <-done)
	}
	line := sc.Text()
	rest, ok := strings.CutPrefix(line, "kfake: serving Kafka on ")
	addrs, _, _ := strings.Cut(rest, " ")
	if !ok || len(strings.Split(addrs, ",")) != 2 {
		t.Fatalf("first line %q: want two addresses", line)
	}
	for _, a := range strings.Split(addrs, ",") {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			t.Fatalf("broker %s: %v", a, err)
		}
		c.Close()
	}
	go io.Copy(io.Discard, outR)
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still serving 10s after its standard input closed")
	}
}
