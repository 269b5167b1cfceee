package servicetest

import (
	"bufio"
	"errors"
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

	cmd    *exec.Cmd
	in     io.WriteCloser
	done   chan struct{}
	stderr *lockedBuilder
	stop   sync.Once
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
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	f := &Fauxqs{cmd: cmd, in: in, done: make(chan struct{}), stderr: &lockedBuilder{}}
	cmd.Stderr = f.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(f.done) }()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "FAUXQS_URL="); ok {
				select {
				case found <- u:
				default:
				}
			}
		}
	}()
	select {
	case f.URL = <-found:
		return f, nil
	case <-f.done:
		return nil, fmt.Errorf("fauxqs exited: %s", f.stderr.String())
	case <-time.After(FauxqsStartTimeout):
		f.Stop()
		return nil, errors.New("fauxqs printed no URL within " + FauxqsStartTimeout.String())
	}
}

// Stop closes the emulator's standard input, on which it exits, and waits
// for it (killing it after 5s). It may be called more than once.
func (f *Fauxqs) Stop() {
	f.stop.Do(func() {
		f.in.Close()
		select {
		case <-f.done:
		case <-time.After(5 * time.Second):
			f.cmd.Process.Kill()
			<-f.done
		}
	})
}

// lockedBuilder collects a child's standard error, written by exec's
// copying goroutine and read by the caller.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
