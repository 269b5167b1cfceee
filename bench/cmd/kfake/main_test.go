package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	s, err := parseFlags([]string{"-addr", "127.0.0.1:0", "-brokers", "3", "-topics", "a:3,b", "-auto-create=false",
		"-min-session-timeout", "100ms", "-sasl", "scram-sha-512:u1:p:w:d", "-sasl", "PLAIN:u2:pw2",
		"-config", "group.share.delivery.count.limit=3", "-config", "group.share.record.lock.duration.ms=2000"})
	if err != nil {
		t.Fatal(err)
	}
	if s.host != "127.0.0.1" || s.port != 0 || s.brokers != 3 || s.autoCreate || s.minSession != 100*time.Millisecond ||
		len(s.topics) != 2 || s.topics[0] != (topicSpec{"a", 3}) || s.topics[1] != (topicSpec{"b", 1}) {
		t.Errorf("parsed %+v", s)
	}
	if len(s.configs) != 2 || s.configs["group.share.delivery.count.limit"] != "3" || s.configs["group.share.record.lock.duration.ms"] != "2000" {
		t.Errorf("configs %v", s.configs)
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

// -advertise: the brokers give clients the given addresses (a proxy's).
func TestAdvertise(t *testing.T) {
	s, err := parseFlags([]string{"-addr", "127.0.0.1:0", "-brokers", "1"})
	if err != nil || s.advertise != nil {
		t.Fatalf("no -advertise: %v, %v", s, err)
	}
	s, err = parseFlags([]string{"-addr", "127.0.0.1:9092", "-brokers", "2", "-advertise", "127.0.0.1:19092,127.0.0.1:19093"})
	if err != nil || len(s.advertise) != 2 || s.advertise[1].String() != "127.0.0.1:19093" {
		t.Fatalf("-advertise: %+v, %v", s, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &cuttingListener{Listener: l, conns: map[net.Conn]bool{}, advertised: s.advertise[0]}
	defer cl.Close()
	if cl.Addr().String() != "127.0.0.1:19092" {
		t.Errorf("a broker's listener reports %s, want the advertised address", cl.Addr())
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
		{[]string{"-control", "10.0.0.1:0"}, "-control \"10.0.0.1:0\": host must be a loopback"},
		{[]string{"-brokers", "0"}, "-brokers 0"},
		{[]string{"-addr", "127.0.0.1:65535", "-brokers", "2"}, "beyond 65535"},
		{[]string{"-partitions", "0"}, "-partitions 0"},
		{[]string{"-min-session-timeout", "0s"}, "must be positive"},
		{[]string{"-tls-cert", "c.pem"}, "go together"},
		{[]string{"-topics", "a:0"}, "partitions must be"},
		{[]string{"-sasl", "GSSAPI:u:" + secret}, "mechanism must be"},
		{[]string{"-sasl", "PLAIN:" + secret}, "MECHANISM:USER:PASSWORD"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"-config", "group.share.delivery.count.limit"}, "want KEY=VALUE"},
		{[]string{"-addr", "127.0.0.1:0", "-advertise", "127.0.0.1:9000"}, "fixed -addr port"},
		{[]string{"-addr", "127.0.0.1:9092", "-brokers", "2", "-advertise", "127.0.0.1:9000"}, "one address per broker"},
		{[]string{"-addr", "127.0.0.1:9092", "-advertise", "10.0.0.1:9000"}, "-advertise \"10.0.0.1:9000\": host must be a loopback"},
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

// serve runs kfake with args and -watch-stdin on free ports until the test
// ends, and returns the first line it prints.
func serve(t *testing.T, args ...string) string {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(append([]string{"-addr", "127.0.0.1:0", "-watch-stdin"}, args...), inR, outW)
		outW.Close()
	}()
	t.Cleanup(func() {
		inW.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("still serving 10s after its standard input closed")
		}
	})
	sc := bufio.NewScanner(outR)
	if !sc.Scan() {
		t.Fatalf("no output: %v", <-done)
	}
	go io.Copy(io.Discard, outR)
	return sc.Text()
}

// TestControl drives a three-broker cluster through the control listener:
// leaders move, a broker is removed (its connections are cut, its port
// refuses) and added back on its port, and bad commands get errors.
func TestControl(t *testing.T) {
	line := serve(t, "-brokers", "3", "-topics", "pay:3", "-auto-create=false", "-control", "127.0.0.1:0")
	_, ctlAddr, ok := strings.Cut(line, "control on ")
	ctlAddr, _, _ = strings.Cut(ctlAddr, ")")
	if !ok {
		t.Fatalf("first line %q names no control address", line)
	}
	rest, _ := strings.CutPrefix(line, "kfake: serving Kafka on ")
	addrs, _, _ := strings.Cut(rest, " ")
	brokers := strings.Split(addrs, ",")
	if len(brokers) != 3 {
		t.Fatalf("first line %q: want three addresses", line)
	}
	conn, err := net.DialTimeout("tcp", ctlAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	answers := bufio.NewScanner(conn)
	send := func(cmd string) string {
		t.Helper()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintln(conn, cmd); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if !answers.Scan() {
			t.Fatalf("%s: no answer: %v", cmd, answers.Err())
		}
		return answers.Text()
	}
	expect := func(cmd, want string) {
		t.Helper()
		if got := send(cmd); got != want {
			t.Errorf("%s: %q, want %q", cmd, got, want)
		}
	}
	expectError := func(cmd, want string) {
		t.Helper()
		if got := send(cmd); !strings.HasPrefix(got, "error: ") || !strings.Contains(got, want) {
			t.Errorf("%s: %q, want an error saying %q", cmd, got, want)
		}
	}

	all := fmt.Sprintf("0=%s,1=%s,2=%s", brokers[0], brokers[1], brokers[2])
	expect("brokers", "ok "+all)
	for b := range 3 {
		expect(fmt.Sprintf("move pay 1 %d", b), "ok")
		expect("leader pay 1", fmt.Sprintf("ok %d", b))
	}
	expect("shuffle", "ok")
	if got := send("coordinator some-group"); got != "ok 0" && got != "ok 1" && got != "ok 2" {
		t.Errorf("coordinator: %q", got)
	}

	// A client connected to broker 1 loses its connection when broker 1
	// is removed, and cannot connect again until it is back.
	client, err := net.DialTimeout("tcp", brokers[1], 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	expect("move pay 0 1", "ok")
	expect("remove 1", "ok")
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a connection to the removed broker: read %v, want EOF (cut)", err)
	}
	if c, err := net.DialTimeout("tcp", brokers[1], time.Second); err == nil {
		c.Close()
		t.Error("the removed broker still accepts connections")
	}
	expect("brokers", fmt.Sprintf("ok 0=%s,2=%s", brokers[0], brokers[2]))
	if got := send("leader pay 0"); got != "ok 0" && got != "ok 2" {
		t.Errorf("leader of a partition the removed broker led: %q, want 0 or 2", got)
	}
	expectError("move pay 0 1", "node 1 not found")
	expectError("remove 1", "node 1 not found")

	expect("add 1", "ok "+brokers[1])
	expect("brokers", "ok "+all)
	c, err := net.DialTimeout("tcp", brokers[1], 5*time.Second)
	if err != nil {
		t.Fatalf("broker 1 is back but refuses connections: %v", err)
	}
	c.Close()
	expect("move pay 2 1", "ok")
	expect("leader pay 2", "ok 1")

	expectError("add 0", "broker 0 is in the cluster")
	expectError("move nope 0 0", "not found")
	expectError("move pay 0", "takes 3 arguments")
	expectError("leader pay x", `partition "x"`)
	expectError("leader pay 7", "no partition 7")
	expectError("elect", "unknown command")
	expect("remove 0", "ok")
	expect("remove 2", "ok")
	expectError("remove 1", "cannot remove all brokers")
}
