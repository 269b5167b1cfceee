package servicetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RabbitServer is the rabbitmq-server start script StartRabbitCluster runs
// (the one the packaged /usr/sbin wrapper calls, which would otherwise
// read the machine's own configuration and cookie).
const RabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// RabbitNodeStartTimeout bounds how long a private RabbitMQ node may take
// to boot (a cold start on a loaded machine takes 10-20 s).
const RabbitNodeStartTimeout = 90 * time.Second

// RabbitCluster is a private RabbitMQ cluster of nodes on loopback ports,
// started by StartRabbitCluster from the installed rabbitmq-server, with
// its own node names, Erlang cookie, configuration and data directories:
// nothing of the machine's own broker (rabbit@localhost on 5672) is used
// or touched. Every node has the user guest (password guest) and the
// vhost "/". Its methods fail the test that started it on trouble; they
// are safe for concurrent use.
type RabbitCluster struct {
	t     testing.TB
	dir   string // the cluster's directory, removed at cleanup
	env   []string
	ctl   string // rabbitmqctl
	asUID *syscall.Credential

	mu    sync.Mutex
	nodes []*rabbitNode
}

type rabbitNode struct {
	name     string // node@localhost
	port     int    // AMQP listener on 127.0.0.1
	distPort int
	dir      string
	cmd      *exec.Cmd // nil while stopped
	done     chan struct{}
	out      *Buffer
}

// StartRabbitCluster starts n RabbitMQ nodes (n >= 1) from the installed
// rabbitmq-server, joins nodes 1..n-1 to node 0, and returns once the
// cluster runs. When the test ends every node is killed (also when the
// test failed) and the cluster's directory removed; the nodes also die
// with the test process, as each watches a pipe from it. Run as root, the
// nodes run as the rabbitmq user. When rabbitmq-server is not installed
// the test ends through Unavailable.
func StartRabbitCluster(t testing.TB, n int) *RabbitCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("StartRabbitCluster: %d nodes", n)
	}
	ctl := filepath.Join(filepath.Dir(RabbitServer), "rabbitmqctl")
	for _, f := range []string{RabbitServer, ctl} {
		if _, err := os.Stat(f); err != nil {
			Unavailable(t, "no RabbitMQ to start a private cluster: %v; install rabbitmq-server", err)
		}
	}
	c := &RabbitCluster{t: t, ctl: ctl}
	dir, err := os.MkdirTemp("", "idemq-rabbitcluster-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(c.cleanup)
	if err := os.Chmod(dir, 0o755); err != nil { // the nodes' user passes through it
		t.Fatal(err)
	}
	// The nodes' side: owned by the rabbitmq user when we are root.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("rabbitmq")
		if err != nil {
			Unavailable(t, "running as root without a rabbitmq user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.asUID = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	b := make([]byte, 4)
	rand.Read(b)
	tag := hex.EncodeToString(b)
	cookie := make([]byte, 20)
	rand.Read(cookie)
	cookieText := strings.ToUpper(hex.EncodeToString(cookie))
	nodeHome := filepath.Join(dir, "home")
	ctlHome := filepath.Join(dir, "ctlhome")
	c.mkdir(nodeHome, true)
	c.mkdir(ctlHome, false)
	c.writeFile(filepath.Join(nodeHome, ".erlang.cookie"), cookieText, 0o400, true)
	c.writeFile(filepath.Join(ctlHome, ".erlang.cookie"), cookieText, 0o400, false)
	envFile := filepath.Join(dir, "rabbitmq-env.conf")
	c.writeFile(envFile, "", 0o644, true) // not the machine's /etc/rabbitmq one
	plugins := filepath.Join(dir, "enabled_plugins")
	c.writeFile(plugins, "[].\n", 0o644, true) // no plugin ports to clash
	c.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8",
		"RABBITMQ_CONF_ENV_FILE=" + envFile,
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + plugins,
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
	for i := range n {
		nd := &rabbitNode{
			name:     fmt.Sprintf("idemq-%s-%d@localhost", tag, i),
			port:     FreePort(t),
			distPort: FreePort(t),
			dir:      filepath.Join(dir, fmt.Sprintf("node%d", i)),
		}
		c.mkdir(nd.dir, true)
		for _, sub := range []string{"mnesia", "log"} {
			c.mkdir(filepath.Join(nd.dir, sub), true)
		}
		c.writeFile(filepath.Join(nd.dir, "rabbitmq.conf"), fmt.Sprintf(
			"listeners.tcp.local = 127.0.0.1:%d\nloopback_users.guest = true\ndisk_free_limit.absolute = 1MB\nlog.console = false\nlog.file.level = info\n",
			nd.port), 0o644, true)
		c.nodes = append(c.nodes, nd)
	}
	// Boot the nodes side by side, then join the others to node 0.
	begin := time.Now()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.start(i) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("starting a %d-node RabbitMQ cluster: %v", n, err)
	}
	booted := time.Now()
	for i := 1; i < n; i++ {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].name}, {"start_app"}} {
			if out, err := c.Ctl(i, args...); err != nil {
				t.Fatalf("node %d: rabbitmqctl %s: %v\n%s", i, strings.Join(args, " "), err, out)
			}
		}
	}
	t.Logf("RabbitMQ cluster of %d nodes at %s: booted in %v, joined in %v", n, c.URL(), booted.Sub(begin).Round(time.Millisecond), time.Since(booted).Round(time.Millisecond))
	return c
}

// mkdir makes a directory, owned by the nodes' user when forNodes.
func (c *RabbitCluster) mkdir(dir string, forNodes bool) {
	c.t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
	c.own(dir, forNodes)
}

// writeFile writes a file, owned by the nodes' user when forNodes.
func (c *RabbitCluster) writeFile(name, text string, mode os.FileMode, forNodes bool) {
	c.t.Helper()
	if err := os.WriteFile(name, []byte(text), mode); err != nil {
		c.t.Fatal(err)
	}
	c.own(name, forNodes)
}

func (c *RabbitCluster) own(name string, forNodes bool) {
	c.t.Helper()
	if c.asUID == nil || !forNodes {
		return
	}
	if err := os.Chown(name, int(c.asUID.Uid), int(c.asUID.Gid)); err != nil {
		c.t.Fatal(err)
	}
}

// Len returns the number of nodes.
func (c *RabbitCluster) Len() int { return len(c.nodes) }

// NodeName returns node i's Erlang node name (name@localhost).
func (c *RabbitCluster) NodeName(i int) string { return c.nodes[i].name }

// Addr returns node i's AMQP listener, 127.0.0.1:PORT.
func (c *RabbitCluster) Addr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[i].port))
}

// Index returns the index of the node whose AMQP listener is addr
// (host:port, as a connection's RemoteAddr), or of the node named addr
// (name@localhost); -1 if none is.
func (c *RabbitCluster) Index(addr string) int {
	for i, nd := range c.nodes {
		if addr == c.Addr(i) || addr == nd.name {
			return i
		}
	}
	return -1
}

// NodeURL returns the AMQP URL of node i alone, for the default vhost.
func (c *RabbitCluster) NodeURL(i int) string { return "amqp://guest:guest@" + c.Addr(i) + "/" }

// URL returns the multi-node AMQP URL of the whole cluster, for the
// default vhost: amqp://guest:guest@127.0.0.1:P0,127.0.0.1:P1,…/ with the
// nodes in index order.
func (c *RabbitCluster) URL() string {
	addrs := make([]string, len(c.nodes))
	for i := range c.nodes {
		addrs[i] = c.Addr(i)
	}
	return "amqp://guest:guest@" + strings.Join(addrs, ",") + "/"
}

// Running reports whether node i's process is running (it may still be
// booting).
func (c *RabbitCluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].cmd != nil
}

// Stop kills node i with SIGKILL, as a crash or a power loss would: its
// clients' connections break without a goodbye and its peers see it gone.
// It returns once the process has exited.
func (c *RabbitCluster) Stop(i int) {
	c.t.Helper()
	c.mu.Lock()
	nd := c.nodes[i]
	cmd, done := nd.cmd, nd.done
	nd.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		c.t.Fatalf("Stop(%d): node %s is not running", i, nd.name)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Start restarts node i after Stop and returns once it runs again (it
// rejoins the cluster by itself).
func (c *RabbitCluster) Start(i int) {
	c.t.Helper()
	if err := c.start(i); err != nil {
		c.t.Fatalf("Start(%d): %v", i, err)
	}
}

// start boots node i and waits until its application runs and its AMQP
// port accepts connections.
func (c *RabbitCluster) start(i int) error {
	c.mu.Lock()
	nd := c.nodes[i]
	if nd.cmd != nil {
		c.mu.Unlock()
		return fmt.Errorf("node %s is already running", nd.name)
	}
	// The node runs in a process group of its own beside a watcher of this
	// process's pipe: when the pipe closes (Stop is not called, or this
	// process dies) the watcher kills the group, node included.
	cmd := exec.Command("/bin/sh", "-c",
		`exec 3<&0; "$0" <&- & node=$!; (cat <&3 >/dev/null; kill -KILL 0) & wait $node; kill -KILL 0`, RabbitServer)
	cmd.Dir = nd.dir
	cmd.Env = append(append([]string{}, c.env...),
		"HOME="+filepath.Join(c.dir, "home"),
		"RABBITMQ_NODENAME="+nd.name,
		"RABBITMQ_DIST_PORT="+strconv.Itoa(nd.distPort),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(nd.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(nd.dir, "advanced.config"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(nd.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(nd.dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(nd.dir, "node.pid"),
		`RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}`,
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.asUID}
	out := &Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	in, err := cmd.StdinPipe()
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("node %s: %w", nd.name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); in.Close(); close(done) }()
	nd.cmd, nd.done, nd.out = cmd, done, out
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), RabbitNodeStartTimeout)
	defer cancel()
	for {
		// await_startup waits for the node to boot, but fails at once while
		// the node is not yet reachable: poll it.
		actx, acancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := c.ctlContext(actx, i, "await_startup", "--timeout", "15")
		acancel()
		if err == nil {
			conn, derr := net.DialTimeout("tcp", c.Addr(i), time.Second)
			if derr == nil {
				conn.Close()
				return nil
			}
			err = derr
		}
		select {
		case <-done:
			return fmt.Errorf("node %s exited while starting:\n%s\n%s", nd.name, out.String(), c.logTail(i))
		case <-ctx.Done():
			return fmt.Errorf("node %s did not start within %v: %v\n%s\n%s", nd.name, RabbitNodeStartTimeout, err, out.String(), c.logTail(i))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// logTail returns the end of node i's log file, for error messages.
func (c *RabbitCluster) logTail(i int) string {
	b, err := os.ReadFile(filepath.Join(c.nodes[i].dir, "log", c.nodes[i].name+".log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const keep = 4000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}

// Ctl runs rabbitmqctl against node i (rabbitmqctl -n NODE args…) with
// the cluster's cookie and returns its combined output.
func (c *RabbitCluster) Ctl(i int, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.ctlContext(ctx, i, args...)
}

func (c *RabbitCluster) ctlContext(ctx context.Context, i int, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.ctl, append([]string{"-n", c.nodes[i].name}, args...)...)
	cmd.Env = append(append([]string{}, c.env...), "HOME="+filepath.Join(c.dir, "ctlhome"))
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// QueueLeader returns the index of the node that leads quorum queue
// queue (of the default vhost), asking the running nodes in turn; -1 when
// none of them knows the queue's leader.
func (c *RabbitCluster) QueueLeader(queue string) int {
	c.t.Helper()
	var errs []string
	for i := range c.nodes {
		if !c.Running(i) {
			continue
		}
		out, err := c.Ctl(i, "list_queues", "-q", "--no-table-headers", "name", "leader")
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v: %s", c.nodes[i].name, err, out))
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == queue {
				return c.Index(f[1])
			}
		}
		return -1
	}
	c.t.Logf("QueueLeader(%s): no running node answered: %s", queue, strings.Join(errs, "; "))
	return -1
}

// cleanup kills every node still running and removes the cluster's
// directory.
func (c *RabbitCluster) cleanup() {
	c.mu.Lock()
	var running []*rabbitNode
	for _, nd := range c.nodes {
		if nd.cmd != nil {
			running = append(running, nd)
			syscall.Kill(-nd.cmd.Process.Pid, syscall.SIGKILL)
			nd.cmd = nil
		}
	}
	c.mu.Unlock()
	for _, nd := range running {
		select {
		case <-nd.done:
		case <-time.After(10 * time.Second):
			c.t.Logf("cleanup: node %s did not exit after SIGKILL", nd.name)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		c.t.Logf("cleanup: %v", err)
	}
}
