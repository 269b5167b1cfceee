// Command kfake serves an in-process Kafka cluster
// (github.com/twmb/franz-go/pkg/kfake) on loopback ports, so that examples,
// tests and idemq-bench can run against kafka://127.0.0.1:PORT/… without
// Docker or a JVM.
//
// It is a development aid, not a production broker: everything is kept in
// memory, nothing is replicated, and the data is gone when it stops.
//
// Usage, from the bench module (cd bench):
//
//	go run ./cmd/kfake -addr 127.0.0.1:9092 -topics payments:3,payments.dlq:1
//
// It serves until SIGINT or SIGTERM (or, with -watch-stdin, until its
// standard input closes), and prints the addresses it listens on as
//
//	kfake: serving Kafka on 127.0.0.1:9092 (…)
//
// Flags, with their defaults:
//
//	-addr 127.0.0.1:9092      loopback host:port of the first broker; port 0
//	                          gives every broker a free port
//	-brokers 1                brokers in the cluster; with a fixed port they
//	                          listen on port, port+1, …
//	-topics ""                topics created up front, name:partitions[,…]
//	                          (partitions default to 1)
//	-auto-create true         create unknown topics on first use
//	-partitions 1             partitions of auto-created topics
//	-min-session-timeout 6s   smallest consumer group session timeout accepted
//	                          (Kafka's default; lower it for quick rebalances)
//	-tls-cert "" -tls-key ""  PEM certificate and key files: serve TLS only
//	                          (1.2 or later); both or neither (plaintext)
//	-sasl ""                  MECHANISM:USER:PASSWORD, repeatable: require SASL
//	                          authentication, with this user as a superuser;
//	                          PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (none:
//	                          no authentication)
//	-watch-stdin false        exit when standard input closes, so that a
//	                          parent process holding the pipe takes kfake
//	                          with it when it ends
//	-control ""               loopback host:port of a control listener
//	                          (port 0: a free port; "": none), see below
//	-advertise ""             loopback host:port per broker, comma-separated:
//	                          the addresses the brokers give clients in
//	                          metadata instead of their own, for a proxy in
//	                          front of each (needs a fixed -addr port)
//	-config ""                KEY=VALUE, repeatable: a broker config, for
//	                          example group.share.record.lock.duration.ms=2000
//	                          or group.share.delivery.count.limit=3 (share
//	                          groups' lock and delivery limit)
//
// Cluster controls: with -control, kfake also accepts plain TCP connections
// on that address and reads commands from them, one a line, answering each
// with one line: "ok", "ok VALUE", or "error: WHY". They drive the faults a
// real cluster has, while clients are connected:
//
//	move TOPIC PARTITION BROKER  make broker BROKER (a node id, 0..brokers-1
//	                             at start) the partition's leader; clients
//	                             get NOT_LEADER_FOR_PARTITION from the old one
//	shuffle                      elect a random leader for every partition
//	remove BROKER                take the broker away: it stops listening, its
//	                             open connections are cut, and its partitions
//	                             get new leaders among the others (the last
//	                             broker cannot be removed)
//	add BROKER                   bring a removed broker back, with its node id
//	                             and its former port (a new broker gets a free
//	                             port); leaders are shuffled. Answers
//	                             "ok HOST:PORT"
//	leader TOPIC PARTITION       answers "ok BROKER", the partition's leader
//	coordinator GROUP            answers "ok BROKER", the group's coordinator
//	brokers                      answers "ok 0=HOST:PORT,1=HOST:PORT,…", the
//	                             brokers in the cluster now
//
// For example, with -control 127.0.0.1:9190: printf 'remove 1\n' | nc
// 127.0.0.1 9190. The control's address is in the first line kfake prints,
// as "control on HOST:PORT".
//
// Then point anything at it by URL, for example:
//
//	kafka://127.0.0.1:9092/payments?group=billing   (core.OpenSource)
//	IDEMQ_KAFKA_URL=kafka://127.0.0.1:9092 go test ./brokers/kafka/
//
// (without IDEMQ_KAFKA_URL the library's Kafka tests build and start this
// command themselves, a cluster per test: internal/servicetest.StartKfake).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(2)
	}
}

// settings are the command line's flags, checked.
type settings struct {
	host       string
	port       int
	brokers    int
	topics     []topicSpec
	autoCreate bool
	partitions int
	minSession time.Duration
	tlsCert    string
	tlsKey     string
	users      []saslUser
	watchStdin bool
	control    string
	advertise  []*net.TCPAddr // by broker, or nil
	configs    map[string]string
}

// saslUser is one -sasl value.
type saslUser struct {
	mechanism, user, password string
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	s, err := parseFlags(args)
	if err != nil {
		return err
	}
	opts, err := s.options()
	if err != nil {
		return err
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	addrs := c.ListenAddrs()
	control := ""
	if s.control != "" {
		ctl, err := newController(c, s.control, addrs)
		if err != nil {
			return err
		}
		defer ctl.Close()
		control = "; control on " + ctl.ln.Addr().String()
	}
	fmt.Fprintf(stdout, "kfake: serving Kafka on %s (development aid: in memory, not a production broker%s); Ctrl-C stops it\n",
		strings.Join(addrs, ","), control)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if s.watchStdin {
		go func() {
			io.Copy(io.Discard, stdin)
			stop()
		}()
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "kfake: stopping")
	return nil
}

// parseFlags reads and checks the command line.
func parseFlags(args []string) (*settings, error) {
	fs := flag.NewFlagSet("kfake", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:9092", "loopback host:port of the first broker (port 0: a free port for every broker)")
	brokers := fs.Int("brokers", 1, "brokers in the cluster (with a fixed port they listen on port, port+1, …)")
	topics := fs.String("topics", "", "topics to create, name:partitions[,name:partitions...]")
	auto := fs.Bool("auto-create", true, "create unknown topics on first use (with -partitions partitions)")
	parts := fs.Int("partitions", 1, "partitions of auto-created topics")
	minSession := fs.Duration("min-session-timeout", 6*time.Second, "smallest consumer group session timeout accepted (Kafka's default 6s; lower it for fast rebalances in tests)")
	tlsCert := fs.String("tls-cert", "", "PEM certificate file: serve TLS only, with -tls-key (default plaintext)")
	tlsKey := fs.String("tls-key", "", "PEM private key file of -tls-cert")
	var users []saslUser
	var saslErr error
	fs.Func("sasl", "MECHANISM:USER:PASSWORD (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), repeatable: require SASL, with this superuser (default no authentication)", func(v string) error {
		// The error is reported after parsing: the flag package's own
		// message would quote the value, password included.
		u, err := parseSASL(v)
		if err != nil && saslErr == nil {
			saslErr = fmt.Errorf("-sasl: %w", err)
		}
		users = append(users, u)
		return nil
	})
	configs := map[string]string{}
	fs.Func("config", "KEY=VALUE, repeatable: a broker config (group.share.record.lock.duration.ms, group.share.delivery.count.limit, …)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", v)
		}
		configs[k] = val
		return nil
	})
	watch := fs.Bool("watch-stdin", false, "exit when standard input closes (for a parent process that holds the pipe)")
	advertise := fs.String("advertise", "", "loopback host:port per broker, comma-separated, given to clients in metadata instead of the brokers' own (for a proxy in front of each; needs a fixed -addr port)")
	control := fs.String("control", "", "loopback host:port of a listener for cluster control commands (move, shuffle, remove, add, …; port 0: a free port; default none)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if saslErr != nil {
		return nil, saslErr
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	host, port, err := loopback("-addr", *addr)
	if err != nil {
		return nil, err
	}
	switch {
	case *brokers < 1 || *brokers > 100:
		return nil, fmt.Errorf("-brokers %d: must be from 1 to 100", *brokers)
	case port != 0 && port+*brokers-1 > 65535:
		return nil, fmt.Errorf("-brokers %d from port %d: ports beyond 65535", *brokers, port)
	case *parts < 1:
		return nil, fmt.Errorf("-partitions %d: must be at least 1", *parts)
	case *minSession <= 0:
		return nil, fmt.Errorf("-min-session-timeout %v: must be positive", *minSession)
	case (*tlsCert == "") != (*tlsKey == ""):
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	if *control != "" {
		if _, _, err := loopback("-control", *control); err != nil {
			return nil, err
		}
	}
	specs, err := parseTopics(*topics)
	if err != nil {
		return nil, err
	}
	var adv []*net.TCPAddr
	if *advertise != "" {
		list := strings.Split(*advertise, ",")
		if port == 0 || len(list) != *brokers {
			return nil, fmt.Errorf("-advertise: give one address per broker (%d) and a fixed -addr port", *brokers)
		}
		for _, a := range list {
			if _, _, err := loopback("-advertise", a); err != nil {
				return nil, err
			}
			ta, err := net.ResolveTCPAddr("tcp", a)
			if err != nil {
				return nil, fmt.Errorf("-advertise %q: %w", a, err)
			}
			adv = append(adv, ta)
		}
	}
	return &settings{advertise: adv,
		host: host, port: port, brokers: *brokers, topics: specs, autoCreate: *auto, partitions: *parts,
		minSession: *minSession, tlsCert: *tlsCert, tlsKey: *tlsKey, users: users, watchStdin: *watch,
		control: *control, configs: configs,
	}, nil
}

// loopback splits addr, the value of flag, which must be on a loopback
// address: kfake is a development aid.
func loopback(flag, addr string) (host string, port int, err error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: %w", flag, addr, err)
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", 0, fmt.Errorf("%s %q: host must be a loopback address (this is a development aid)", flag, addr)
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%s %q: bad port", flag, addr)
	}
	return host, port, nil
}

// options turns the settings into kfake options.
func (s *settings) options() ([]kfake.Opt, error) {
	opts := []kfake.Opt{
		kfake.NumBrokers(s.brokers),
		kfake.DefaultNumPartitions(s.partitions),
		kfake.GroupMinSessionTimeout(s.minSession),
		// kfake asks for 127.0.0.1:<port>; listen on -addr's host instead.
		// The listener cuts the connections it accepted when it closes,
		// as when a broker's process goes away: kfake closes it when a
		// broker is removed.
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			_, port, err := net.SplitHostPort(address)
			if err != nil {
				return nil, err
			}
			ln, err := net.Listen(network, net.JoinHostPort(s.host, port))
			if err != nil {
				return nil, err
			}
			cl := &cuttingListener{Listener: ln, conns: map[net.Conn]bool{}}
			if p, _ := strconv.Atoi(port); s.advertise != nil && p >= s.port && p-s.port < len(s.advertise) {
				// kfake gives clients its listener's address.
				cl.advertised = s.advertise[p-s.port]
			}
			return cl, nil
		}),
	}
	if s.port != 0 {
		ports := make([]int, s.brokers)
		for i := range ports {
			ports[i] = s.port + i
		}
		opts = append(opts, kfake.Ports(ports...))
	}
	if len(s.configs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(s.configs))
	}
	if s.autoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	for _, t := range s.topics {
		opts = append(opts, kfake.SeedTopics(t.partitions, t.name))
	}
	if s.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(s.tlsCert, s.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}
	if len(s.users) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range s.users {
			opts = append(opts, kfake.Superuser(u.mechanism, u.user, u.password))
		}
	}
	return opts, nil
}

// parseSASL parses MECHANISM:USER:PASSWORD; the password may hold ':'.
// Errors never quote the password.
func parseSASL(v string) (saslUser, error) {
	parts := strings.SplitN(v, ":", 3)
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return saslUser{}, errors.New("want MECHANISM:USER:PASSWORD, none of them empty")
	}
	switch m := strings.ToUpper(parts[0]); m {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		return saslUser{m, parts[1], parts[2]}, nil
	}
	return saslUser{}, errors.New("the mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
}

type topicSpec struct {
	name       string
	partitions int32
}

// parseTopics parses "a:3,b,c:1".
func parseTopics(s string) ([]topicSpec, error) {
	var out []topicSpec
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, n, hasN := strings.Cut(part, ":")
		if name == "" {
			return nil, fmt.Errorf("-topics %q: empty topic name", s)
		}
		p := 1
		if hasN {
			v, err := strconv.Atoi(n)
			if err != nil || v < 1 || v > 10000 {
				return nil, fmt.Errorf("-topics: %q: partitions must be 1..10000", part)
			}
			p = v
		}
		out = append(out, topicSpec{name, int32(p)})
	}
	if len(out) == 0 {
		return nil, errors.New("-topics: no topics")
	}
	return out, nil
}
