package servicetest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// FauxqsStartTimeout bounds how long StartFauxqs waits for the emulator to
// print its URL (a cold node start can be slow on a loaded machine).
const FauxqsStartTimeout = 60 * time.Second

// Fauxqs is a running fauxqs SQS emulator, started by StartFauxqs for the
// SQS tests when IDEMQ_SQS_URL is unset.
type Fauxqs struct {
	// URL is the emulator's SQS endpoint on a loopback port.
	URL string
	*child
}

// StartFauxqs runs the fauxqs emulator installed (by `npm ci`) in dir,
// the folder holding start.mjs and node_modules/fauxqs, on a free loopback
// port, and returns it once it has printed its URL. It needs node on the
// PATH. The emulator exits when Stop closes its standard input, and so
// also when the test binary holding that input dies.
func StartFauxqs(dir string) (*Fauxqs, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("node not found: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "fauxqs", "package.json")); err != nil {
		return nil, fmt.Errorf("fauxqs is not installed in %s: %w", dir, err)
	}
	cmd := exec.Command(node, "start.mjs", "--port", "0")
	cmd.Dir = dir
	c, u, err := startChild("fauxqs", cmd, "FAUXQS_URL=", time.After(FauxqsStartTimeout))
	if err != nil {
		return nil, err
	}
	return &Fauxqs{URL: u, child: c}, nil
}

// child is a test service in a process of its own that exits when its
// standard input closes, so a test binary that dies takes it along.
type child struct {
	name   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	done   chan struct{}
	stderr *Buffer
	stop   sync.Once
}

// startChild starts cmd and returns once it printed a line starting with
// prefix, with the rest of that line. It fails with the child's standard
// error when the child exits first, and stops it when deadline passes
// first.
func startChild(name string, cmd *exec.Cmd, prefix string, deadline <-chan time.Time) (*child, string, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	c := &child{name: name, cmd: cmd, in: in, done: make(chan struct{}), stderr: &Buffer{}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	go func() { cmd.Wait(); close(c.done) }()
	found := make(chan string, 1)
	go func() {
		// Read to the end: the child must not write into a closed pipe.
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				select {
				case found <- rest:
				default:
				}
			}
		}
	}()
	select {
	case rest := <-found:
		return c, rest, nil
	case <-c.done:
		return nil, "", c.exited()
	case <-deadline:
		c.Stop()
		return nil, "", fmt.Errorf("%s printed no %q line in time", name, prefix)
	}
}

// exited is the error of a child that ended before it should have.
func (c *child) exited() error {
	return fmt.Errorf("%s exited: %s", c.name, strings.TrimSpace(c.stderr.String()))
}

// Stop closes the child's standard input, on which it exits, and waits
// for it (killing it after 5s). It may be called more than once.
func (c *child) Stop() {
	c.stop.Do(func() {
		c.in.Close()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
		}
	})
}

// Buffer collects what one goroutine writes while another reads it: a
// child's standard error, written by exec's copying goroutine, or a
// logger's output written by an adapter's goroutines. The zero value is
// empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
