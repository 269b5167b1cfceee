package main

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/servicetest"
)

// With --metrics the service serves its decisions for Prometheus: after a
// run with duplicates, /metrics counts processed and duplicate decisions
// under the names the dashboard (docs/dashboards/idemq.json) queries.
func TestMetricsForPrometheus(t *testing.T) {
	u := amqpURL(t)
	q := amqpQueue(t, u)
	bin := serviceBinary(t)
	broker := u + "?queue=" + q
	if out, err := exec.Command(bin, "--broker", broker, "--publish", "50", "--duplicates", "0.2", "--seed", "7").CombinedOutput(); err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	addr := "127.0.0.1:" + strconv.Itoa(servicetest.FreePort(t))
	logPath := filepath.Join(t.TempDir(), "run.log")
	cmd := startService(t, bin, logPath, []string{"--broker", broker, "--store", "sqlite://" + filepath.Join(t.TempDir(), "pay.db"),
		"--metrics", addr}, nil)
	defer stopService(t, "payments", cmd, logPath)

	series := regexp.MustCompile(`(?m)^messaging_client_consumed_messages_total\{[^}]*idemq_decision="(processed|duplicate)"[^}]*\} (\d+)`)
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(b)
		counts := map[string]int{}
		for _, m := range series.FindAllStringSubmatch(last, -1) {
			n, _ := strconv.Atoi(m[2])
			counts[m[1]] += n
		}
		if counts["processed"]+counts["duplicate"] == 50 {
			if counts["duplicate"] == 0 {
				t.Errorf("no duplicate decision counted: %v", counts)
			}
			for _, name := range []string{"messaging_process_duration_seconds_bucket", "idemq_messages_in_flight", "idemq_batch_size_bucket"} {
				if !regexp.MustCompile(`(?m)^` + name + `\b`).MatchString(last) {
					t.Errorf("/metrics lacks %s", name)
				}
			}
			return
		}
	}
	t.Fatalf("/metrics never counted 50 decisions; last scrape:\n%s", last)
}
