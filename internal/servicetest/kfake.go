package servicetest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// KfakeStartTimeout bounds how long NewKfake waits for a started kfake to
// print its addresses and accept connections; building it is not counted.
const KfakeStartTimeout = 30 * time.Second

// ErrNoKfake is the error NewKfake wraps when bench/cmd/kfake cannot be
// built here: its source is not in this checkout (a copy of the module
// without the bench module, as in the module cache), or there is no go
// command on the PATH.
var ErrNoKfake = errors.New("cannot build bench/cmd/kfake")

// Kfake is a running bench/cmd/kfake: an in-memory Kafka cluster on
// loopback ports, in a process of its own, started by NewKfake.
//
// Its methods MoveLeader, ShuffleLeaders, RemoveBroker, AddBroker, Leader,
// Coordinator and Brokers drive the cluster while clients use it, through
// kfake's control listener (the command's -control flag). Brokers are named
// by their node ids, 0 to the number of brokers less one at start.
type Kfake struct {
	// Addr is the brokers' host:port list, comma-separated, as a Kafka
	// client's bootstrap servers.
	Addr string
	// control is the host:port of kfake's control listener.
	control string
	*child
}

// StartKfake starts bench/cmd/kfake with args (see NewKfake), stops it
// when t ends, and returns its brokers' host:port list. When kfake cannot
// be built here (ErrNoKfake) it ends t through Unavailable, naming
// IDEMQ_KAFKA_URL; any other failure fails t.
func StartKfake(t testing.TB, args ...string) string {
	t.Helper()
	k, err := NewKfake(args...)
	if errors.Is(err, ErrNoKfake) {
		Unavailable(t, "no Kafka for the test: %v; set %s to a Kafka cluster", err, KafkaEnv)
	}
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(k.Stop)
	return k.Addr
}

// NewKfake builds bench/cmd/kfake, once per process, and starts it on free
// loopback ports with args after "-addr 127.0.0.1:0 -watch-stdin -control
// 127.0.0.1:0" (so an -addr in args wins; the flags are in the command's doc: -brokers,
// -topics, -auto-create, -min-session-timeout, -tls-cert, -tls-key,
// -sasl, …). It returns once every broker accepts TCP connections. The
// cluster runs until Stop, or until the process holding its standard input
// (this one) ends.
//
// The binary goes to a directory of the user's cache named after the
// checkout, where the go command leaves it as it is while it is up to
// date: later processes do not link it again, and nothing is left behind
// per process.
func NewKfake(args ...string) (*Kfake, error) {
	bin, err := kfakeBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-watch-stdin", "-control", "127.0.0.1:0"}, args...)...)
	deadline := time.After(KfakeStartTimeout)
	c, rest, err := startChild("kfake", cmd, "kfake: serving Kafka on ", deadline)
	if err != nil {
		return nil, err
	}
	addrs, _, _ := strings.Cut(rest, " ")
	k := &Kfake{Addr: addrs, child: c}
	if _, ctl, ok := strings.Cut(rest, "control on "); ok {
		k.control, _, _ = strings.Cut(ctl, ")")
	}
	for _, a := range strings.Split(k.Addr, ",") {
		for {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-k.done:
				return nil, k.exited()
			case <-deadline:
				k.Stop()
				return nil, fmt.Errorf("kfake broker %s accepts no connection within %v: %v", a, KfakeStartTimeout, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return k, nil
}

// kfakeBinary builds bench/cmd/kfake once per process and returns the
// binary's path.
func kfakeBinary() (string, error) {
	bin, err := BenchBinary("kfake", "./cmd/kfake")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoKfake, err)
	}
	return bin, nil
}

// KfakeControlTimeout bounds one control command of a Kfake, from dialing
// its control listener to reading the answer.
const KfakeControlTimeout = 10 * time.Second

// MoveLeader makes broker the leader of the topic's partition. Clients
// that produce to or fetch from the former leader get
// NOT_LEADER_FOR_PARTITION and look the leader up again.
func (k *Kfake) MoveLeader(topic string, partition, broker int) error {
	_, err := k.command(fmt.Sprintf("move %s %d %d", topic, partition, broker))
	return err
}

// ShuffleLeaders elects a random leader among the brokers for every
// partition of every topic, as after an unclean leader election.
func (k *Kfake) ShuffleLeaders() error {
	_, err := k.command("shuffle")
	return err
}

// RemoveBroker takes broker away, as if its process ended: it stops
// listening, the connections it had are cut, and its partitions get new
// leaders among the remaining brokers. The last broker cannot be removed.
func (k *Kfake) RemoveBroker(broker int) error {
	_, err := k.command(fmt.Sprintf("remove %d", broker))
	return err
}

// AddBroker brings a removed broker back with its node id and on its
// former port (a broker never seen before gets a free port), shuffles the
// partition leaders, and returns its host:port.
func (k *Kfake) AddBroker(broker int) (string, error) {
	return k.command(fmt.Sprintf("add %d", broker))
}

// Leader returns the broker that leads the topic's partition.
func (k *Kfake) Leader(topic string, partition int) (int, error) {
	v, err := k.command(fmt.Sprintf("leader %s %d", topic, partition))
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(v)
}

// Coordinator returns the broker that coordinates the consumer group.
func (k *Kfake) Coordinator(group string) (int, error) {
	v, err := k.command("coordinator " + group)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(v)
}

// Brokers returns the host:port of every broker in the cluster now, by
// node id.
func (k *Kfake) Brokers() (map[int]string, error) {
	v, err := k.command("brokers")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, b := range strings.Split(v, ",") {
		id, addr, _ := strings.Cut(b, "=")
		n, err := strconv.Atoi(id)
		if err != nil {
			return nil, fmt.Errorf("kfake control: brokers answered %q", v)
		}
		out[n] = addr
	}
	return out, nil
}

// command sends one command line to kfake's control listener and returns
// the value of an "ok" answer, or the error of an "error:" one.
func (k *Kfake) command(line string) (string, error) {
	if k.control == "" {
		return "", errors.New("kfake control: this kfake serves no control listener (-control)")
	}
	conn, err := net.DialTimeout("tcp", k.control, KfakeControlTimeout)
	if err != nil {
		return "", fmt.Errorf("kfake control: %w", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(KfakeControlTimeout))
	if _, err := fmt.Fprintln(conn, line); err != nil {
		return "", fmt.Errorf("kfake control: %s: %w", line, err)
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("kfake control: %s: no answer: %w", line, err)
	}
	answer = strings.TrimSpace(answer)
	if why, ok := strings.CutPrefix(answer, "error: "); ok {
		return "", fmt.Errorf("kfake control: %s: %s", line, why)
	}
	if answer == "ok" {
		return "", nil
	}
	v, ok := strings.CutPrefix(answer, "ok ")
	if !ok {
		return "", fmt.Errorf("kfake control: %s: answered %q", line, answer)
	}
	return v, nil
}
