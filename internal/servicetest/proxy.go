package servicetest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of a server, whose
// connections a test can cut at a chosen moment: LoseNextAnswer passes
// the next thing a client sends to the server and then closes that
// connection before the server's answer gets back, as a network failure
// or a failover does to a commit in flight.
type Proxy struct {
	// Addr is the proxy's host:port; clients connect here.
	Addr string

	target string
	l      net.Listener
	arm    atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// StartProxy starts a proxy to target (host:port); it stops, and closes
// its connections, when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l, conns: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// cutGrace is how long the server's side of a cut connection may wait for
// the server's answer before the proxy closes it too.
const cutGrace = 2 * time.Second

// LoseNextAnswer arms the proxy: the next bytes any client sends go to the
// server, and then that client's connection is closed, both ways, without
// relaying what the server answers.
func (p *Proxy) LoseNextAnswer() { p.arm.Store(true) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s, true)
		go p.pipe(s, c, false)
	}
}

// pipe copies from src to dst until either fails, then closes both;
// fromClient pipes are where an armed proxy cuts.
func (p *Proxy) pipe(src, dst net.Conn, fromClient bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// Disarm before relaying: an answer can only come after the
			// write, so bytes read before the proxy was armed (the
			// statement before the one to cut) are never taken for the
			// next ones, however late this goroutine runs.
			cut := fromClient && p.arm.CompareAndSwap(true, false)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
			if cut {
				// The request is on its way to the server; close the
				// client's side only. The server's side stays open until
				// its answer comes and finds no client (the other pipe
				// then closes it): closed at once, the server could see
				// the connection end before it had read the request. A
				// server that never answers is cut after cutGrace, so it
				// rolls back what it holds instead of holding its locks
				// for the rest of the test.
				src.Close()
				time.AfterFunc(cutGrace, func() { dst.Close() })
				return
			}
		}
		if err != nil {
			break
		}
	}
	src.Close()
	dst.Close()
}

func (p *Proxy) close() {
	p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
