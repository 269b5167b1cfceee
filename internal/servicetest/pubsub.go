package servicetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PubSubEnv names the host:port of a Pub/Sub emulator the tests use
// instead of starting one.
const PubSubEnv = "IDEMQ_PUBSUB_URL"

// pubsubStartTimeout bounds how long an emulator (a JVM) may take to start
// on a loaded machine.
const pubsubStartTimeout = 90 * time.Second

var pubsubEmulator struct {
	once sync.Once
	host string
	err  error
}

// PubSubEmulator returns the host:port of a Pub/Sub emulator: PubSubEnv's,
// or one it starts on a free loopback port for the whole test binary (it
// dies with it). It sets PUBSUB_EMULATOR_HOST, which the client reads.
// Without either t is skipped, or fails with IDEMQ_REQUIRE_SERVICES=1.
func PubSubEmulator(t testing.TB) string {
	t.Helper()
	e := &pubsubEmulator
	e.once.Do(func() {
		if h := os.Getenv(PubSubEnv); h != "" {
			e.host = strings.TrimPrefix(strings.TrimPrefix(h, "http://"), "pubsub://")
		} else {
			e.host, _, e.err = StartPubSubEmulator()
		}
		if e.err == nil {
			e.err = os.Setenv("PUBSUB_EMULATOR_HOST", e.host)
		}
	})
	if e.err != nil {
		Unavailable(t, "no Pub/Sub emulator (set %s to one's host:port, or install google-cloud-cli-pubsub-emulator): %v", PubSubEnv, e.err)
	}
	return e.host
}

// StartPubSubEmulator starts the Google Cloud SDK's cloud-pubsub-emulator
// (on the PATH, or beside gcloud) on a free loopback port, and returns
// once it serves, with its host:port and a stop. It dies with this
// process.
func StartPubSubEmulator() (host string, stop func(), err error) {
	launcher, err := pubsubLauncher()
	if err != nil {
		return "", nil, err
	}
	p, err := freePort()
	if err != nil {
		return "", nil, err
	}
	port := strconv.Itoa(p)
	host = "127.0.0.1:" + port
	cmd := exec.Command(launcher, "--host=127.0.0.1", "--port="+port)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // the launcher execs java
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	started := make(chan error, 1)
	go func() {
		var log strings.Builder
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if log.WriteString(sc.Text() + "\n"); strings.Contains(sc.Text(), "Server started") {
				started <- nil
				io.Copy(io.Discard, out) // the emulator must not block on a full pipe
				return
			}
		}
		started <- fmt.Errorf("the emulator exited:\n%s", log.String())
	}()
	select {
	case err = <-started:
	case <-time.After(pubsubStartTimeout):
		err = fmt.Errorf("the emulator did not start within %v", pubsubStartTimeout)
	}
	if err != nil {
		stop()
		return "", nil, err
	}
	return host, stop, nil
}

// pubsubLauncher finds cloud-pubsub-emulator: on the PATH, or beside
// gcloud.
func pubsubLauncher() (string, error) {
	if p, err := exec.LookPath("cloud-pubsub-emulator"); err == nil {
		return p, nil
	}
	gcloud, err := exec.LookPath("gcloud")
	if err != nil {
		return "", errors.New("neither cloud-pubsub-emulator nor gcloud on the PATH")
	}
	if gcloud, err = filepath.EvalSymlinks(gcloud); err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(gcloud), "..", "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no Pub/Sub emulator beside gcloud: %w", err)
	}
	return p, nil
}
