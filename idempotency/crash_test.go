package idempotency

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemq/idemq/stores/storetest"
)

// crashEnv makes the test binary a child that serves the middleware and
// kills itself right after a request's commit; its value is a crashSpec.
const crashEnv = "IDEMQ_IDEMPOTENCY_CRASH_CHILD"

type crashSpec struct {
	Backend string
	Names   names
}

// A process killed between the commit and the response: the client gets
// no answer, the effect is in once, and its retry to another process gets
// the stored response without applying it again.
func TestCrashAfterCommit(t *testing.T) {
	if spec := os.Getenv(crashEnv); spec != "" {
		crashChild(t, spec)
		return
	}
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			n := newNames(t)
			f := open(t, b, n, true)
			spec, _ := json.Marshal(crashSpec{Backend: b, Names: n})
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAfterCommit$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashEnv+"="+string(spec))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			url := ""
			for sc := bufio.NewScanner(out); sc.Scan(); {
				if u, ok := strings.CutPrefix(sc.Text(), "serving "); ok {
					url = u
					break
				}
			}
			if url == "" {
				t.Fatal("the child did not start serving")
			}
			order := storetest.UniqueName("o")
			body := `{"order":"` + order + `"}`
			if a, err := tryPost(url, "k-"+order, body); err == nil {
				t.Fatalf("the crashing child answered %d %s", a.status, a.body)
			}
			if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
				t.Fatalf("the child was not killed: %v", err)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects after the crash, want 1", got)
			}
			a := post(t, serve(t, f.handler(f.orders())), "k-"+order, body)
			if a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(a.body, order) {
				t.Fatalf("retry: %d %v %s", a.status, a.header, a.body)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects after the retry, want 1", got)
			}
		})
	}
}

// crashChild serves the middleware over the parent's tables and kills
// its own process (SIGKILL on Unix) right after the first commit.
func crashChild(t *testing.T, spec string) {
	var s crashSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	f := open(t, s.Backend, s.Names, false)
	f.setAfterCommit(func() {
		p, _ := os.FindProcess(os.Getpid())
		p.Kill()
		select {} // the kill lands before the response is written
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/orders", f.handler(f.orders()))
	fmt.Println("serving http://" + ln.Addr().String() + "/orders")
	t.Fatal(http.Serve(ln, mux))
}
