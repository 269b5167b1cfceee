package benchmark

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestRunPubSubPostgres runs every configuration on Google's Pub/Sub
// emulator (IDEMQ_PUBSUB_URL, its host:port, or a private one the test
// starts) into Postgres.
func TestRunPubSubPostgres(t *testing.T) {
	pgURL := servicetest.PostgresURL(t)
	host := os.Getenv("IDEMQ_PUBSUB_URL")
	if host == "" {
		var stop func()
		var err error
		if host, stop, err = startPubSubEmulator(); err != nil {
			servicetest.Unavailable(t, "no Pub/Sub emulator (set IDEMQ_PUBSUB_URL to one's host:port, or install google-cloud-cli-pubsub-emulator): %v", err)
		}
		t.Cleanup(stop)
	}
	t.Setenv("PUBSUB_EMULATOR_HOST", strings.TrimPrefix(host, "http://"))
	rep := runSmall(t, "pubsub://idemq-bench/idemq-bench-test", pgURL, 300, 50, allConfigs)
	if !strings.Contains(rep.Machine.Broker, "Pub/Sub emulator") {
		t.Errorf("broker %q", rep.Machine.Broker)
	}
}

// startPubSubEmulator starts the Google Cloud SDK's emulator (on the PATH
// or beside gcloud) on a free loopback port; it dies with this process.
func startPubSubEmulator() (string, func(), error) {
	launcher, err := exec.LookPath("cloud-pubsub-emulator")
	if err != nil {
		gcloud, gerr := exec.LookPath("gcloud")
		if gerr == nil {
			gcloud, gerr = filepath.EvalSymlinks(gcloud)
		}
		if gerr != nil {
			return "", nil, errors.Join(err, gerr)
		}
		launcher = filepath.Join(filepath.Dir(gcloud), "..", "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	host := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(host)
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
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server started") {
				started <- true
				io.Copy(io.Discard, out)
				return
			}
		}
		started <- false
	}()
	select {
	case ok := <-started:
		if ok {
			return host, stop, nil
		}
		err = errors.New("the emulator exited before it started")
	case <-time.After(90 * time.Second):
		err = errors.New("the emulator did not start within 90s")
	}
	stop()
	return "", nil, err
}
