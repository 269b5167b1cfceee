package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
)

// controller serves the cluster control commands (see the command's doc)
// on a loopback listener.
type controller struct {
	c    *kfake.Cluster
	host string // the brokers' listening host, for the address add answers
	ln   net.Listener

	mu    sync.Mutex // serializes commands; guards the fields below
	addrs map[int32]string
	live  map[int32]bool
	conns map[net.Conn]bool // open control connections, cut by Close

	wg sync.WaitGroup
}

// newController listens on addr for control connections to c, whose
// brokers, node 0 first, listen on addrs.
func newController(c *kfake.Cluster, addr string, addrs []string) (*controller, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-control: %w", err)
	}
	k := &controller{c: c, ln: ln, addrs: map[int32]string{}, live: map[int32]bool{}, conns: map[net.Conn]bool{}}
	for i, a := range addrs {
		k.addrs[int32(i)] = a
		k.live[int32(i)] = true
		if k.host == "" {
			k.host, _, _ = net.SplitHostPort(a)
		}
	}
	k.wg.Add(1)
	go k.serve()
	return k, nil
}

func (k *controller) serve() {
	defer k.wg.Done()
	for {
		conn, err := k.ln.Accept()
		if err != nil {
			return
		}
		k.mu.Lock()
		if k.conns == nil { // closed
			k.mu.Unlock()
			conn.Close()
			return
		}
		k.conns[conn] = true
		k.wg.Add(1)
		k.mu.Unlock()
		go k.session(conn)
	}
}

// session answers the commands read from one connection until it closes.
func (k *controller) session(conn net.Conn) {
	defer k.wg.Done()
	defer func() {
		k.mu.Lock()
		delete(k.conns, conn)
		k.mu.Unlock()
		conn.Close()
	}()
	sc := bufio.NewScanner(conn)
	w := bufio.NewWriter(conn)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		answer := "ok"
		v, err := k.do(sc.Text())
		switch {
		case err != nil:
			answer = "error: " + strings.ReplaceAll(err.Error(), "\n", " ")
		case v != "":
			answer += " " + v
		}
		if _, err := fmt.Fprintln(w, answer); err != nil {
			return
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
}

// Close stops the listener, cuts the control connections and waits for
// commands under way to finish.
func (k *controller) Close() error {
	err := k.ln.Close()
	k.mu.Lock()
	for conn := range k.conns {
		conn.Close()
	}
	k.conns = nil
	k.mu.Unlock()
	k.wg.Wait()
	return err
}

// do runs one command line and returns the value of its answer.
func (k *controller) do(line string) (string, error) {
	f := strings.Fields(line)
	cmd, args := f[0], f[1:]
	want := map[string]int{"move": 3, "shuffle": 0, "remove": 1, "add": 1, "leader": 2, "coordinator": 1, "brokers": 0}
	n, ok := want[cmd]
	if !ok {
		return "", fmt.Errorf("unknown command %q (move, shuffle, remove, add, leader, coordinator, brokers)", cmd)
	}
	if len(args) != n {
		return "", fmt.Errorf("%s takes %d arguments, not %d", cmd, n, len(args))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch cmd {
	case "move":
		p, err := number("partition", args[1])
		if err != nil {
			return "", err
		}
		b, err := number("broker", args[2])
		if err != nil {
			return "", err
		}
		return "", k.c.MoveTopicPartition(args[0], p, b)
	case "shuffle":
		k.c.ShufflePartitionLeaders()
		return "", nil
	case "remove":
		b, err := number("broker", args[0])
		if err != nil {
			return "", err
		}
		// kfake closes the broker's listener, which cuts the connections
		// it accepted (cuttingListener).
		if err := k.c.RemoveNode(b); err != nil {
			return "", err
		}
		k.live[b] = false
		return "", nil
	case "add":
		b, err := number("broker", args[0])
		if err != nil {
			return "", err
		}
		if k.live[b] {
			return "", fmt.Errorf("broker %d is in the cluster", b)
		}
		port := 0
		if a, ok := k.addrs[b]; ok {
			_, p, _ := net.SplitHostPort(a)
			port, _ = strconv.Atoi(p)
		}
		id, port, err := k.c.AddNode(b, port)
		if err != nil {
			return "", err
		}
		a := net.JoinHostPort(k.host, strconv.Itoa(port))
		k.addrs[id] = a
		k.live[id] = true
		return a, nil
	case "leader":
		p, err := number("partition", args[1])
		if err != nil {
			return "", err
		}
		b := k.c.LeaderFor(args[0], p)
		if b < 0 {
			return "", fmt.Errorf("no partition %d of topic %q", p, args[0])
		}
		return strconv.Itoa(int(b)), nil
	case "coordinator":
		return strconv.Itoa(int(k.c.CoordinatorFor(args[0]))), nil
	default: // brokers
		var ids []int32
		for id, up := range k.live {
			if up {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		list := make([]string, len(ids))
		for i, id := range ids {
			list[i] = fmt.Sprintf("%d=%s", id, k.addrs[id])
		}
		return strings.Join(list, ","), nil
	}
}

// number parses a node id or partition.
func number(what, s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q: want a number from 0", what, s)
	}
	return int32(n), nil
}

// cuttingListener is a broker's listener that cuts the connections it
// accepted when it closes, as a broker's process going away does: kfake
// closes it when the broker is removed, but would go on serving the
// connections already open.
type cuttingListener struct {
	net.Listener
	advertised net.Addr // reported by Addr instead of the real one, when set
	mu         sync.Mutex
	conns      map[net.Conn]bool
	closed     bool
}

// Addr returns the address clients are told: the advertised one if any.
func (l *cuttingListener) Addr() net.Addr {
	if l.advertised != nil {
		return l.advertised
	}
	return l.Listener.Addr()
}

func (l *cuttingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		conn.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: conn, l: l}
	l.conns[tc] = true
	return tc, nil
}

func (l *cuttingListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	conns := l.conns
	l.conns, l.closed = nil, true
	l.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil // kfake closes it twice when a broker is removed
	}
	return err
}

// trackedConn is a connection a cuttingListener accepted.
type trackedConn struct {
	net.Conn
	l *cuttingListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
