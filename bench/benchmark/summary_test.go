package benchmark

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func runs(rates ...float64) []RunResult {
	rs := make([]RunResult, len(rates))
	for i, r := range rates {
		rs[i] = RunResult{MsgsPerSec: r}
	}
	return rs
}

// The summary reads reports back from JSON and compares the interleaved
// runs pair by pair: the paired range is not the ratio of the extremes.
func TestSummaryOfReports(t *testing.T) {
	rep := &Report{
		Machine: Machine{Database: "10.11.6-MariaDB-0+deb12u1"},
		Params:  Params{Broker: "amqp://guest:xxxxx@127.0.0.1:5672/?queue=q", Store: "mysql://root@127.0.0.1:3306/test", BatchSize: 200},
		Results: []*Result{
			{Name: HandBatch, Baseline: true, Runs: runs(100, 200, 300), MsgsPerSec: Summary{Median: 200, Min: 100, Max: 300}, UserCPU: 10_000},
			{Name: IdemqBatch, Runs: runs(90, 220, 360), MsgsPerSec: Summary{Median: 220, Min: 90, Max: 360}, UserCPU: 12_000},
		},
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	back, err := ReadReport(&js)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Pair(); got != "RabbitMQ → MariaDB" {
		t.Errorf("Pair() = %q", got)
	}
	lo, hi, ok := back.Paired(IdemqBatch, HandBatch)
	if !ok || lo != 0.9 || hi != 1.2 {
		t.Errorf("Paired = %v %v %v, want 0.90 1.20 true", lo, hi, ok)
	}
	var out bytes.Buffer
	if err := WriteSummary(&out, []*Report{back}); err != nil {
		t.Fatal(err)
	}
	row := "| RabbitMQ → MariaDB | 200 (100–300) | 220 (90–360) | 1.10 met | 0.90–1.20 **missed** | 12.0 / 10.0 µs = 1.20 **missed** |"
	if !strings.Contains(out.String(), row) {
		t.Errorf("summary lacks\n%s\n%s", row, out.String())
	}
	if err := WriteSummaryPNG(filepath.Join(t.TempDir(), "s.png"), []*Report{back}); err != nil {
		t.Error(err)
	}
	if err := WriteSummaryPNG(filepath.Join(t.TempDir(), "s.png"), nil); err == nil {
		t.Error("a chart of no report drew nothing without an error")
	}
}
