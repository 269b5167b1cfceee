package servicetest

import (
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is the running process of a private server a test starts,
// stops and restarts (MariaDBServer, NATSServer).
type process struct {
	mu   sync.Mutex
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd has exited
}

// start starts cmd and records it as the running process.
func (p *process) start(cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

// exited is closed once the running process has exited.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// stop sends SIGTERM and waits for the exit, killing the process after
// grace (at once, without a SIGTERM, when grace is 0). Stopping a stopped
// process does nothing.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	if grace == 0 {
		cmd.Process.Kill()
		<-done
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-done
	}
}
