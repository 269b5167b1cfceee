package benchmark

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"net/url"
	"strings"

	"github.com/dustin/go-humanize"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// ReadReport reads a report as WriteJSON wrote it.
func ReadReport(r io.Reader) (*Report, error) {
	var rep Report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return nil, fmt.Errorf("benchmark: reading a report: %w", err)
	}
	return &rep, nil
}

// Pair names the broker and store of a report, such as "RabbitMQ →
// Postgres", from its URLs' schemes and the database's version string.
func (rep *Report) Pair() string {
	broker := map[string]string{"amqp": "RabbitMQ", "amqps": "RabbitMQ", "kafka": "Kafka", "sqs": "SQS", "pubsub": "Pub/Sub",
		"nats": "NATS", "redis": "Redis", "rediss": "Redis"}
	b, s := scheme(rep.Params.Broker), scheme(rep.Params.Store)
	name := broker[b]
	if name == "" {
		name = b
	}
	store := map[string]string{"postgres": "Postgres", "postgresql": "Postgres", "mysql": "MySQL"}[s]
	if store == "MySQL" && strings.Contains(rep.Machine.Database, "MariaDB") {
		store = "MariaDB"
	}
	if store == "" {
		store = s
	}
	return name + " → " + store
}

func scheme(u string) string {
	if p, err := url.Parse(u); err == nil && p.Scheme != "" {
		return p.Scheme
	}
	s, _, _ := strings.Cut(u, ":")
	return s
}

// Paired compares the interleaved runs of configurations num and den run
// for run (run i of each is a pair): the lowest and highest of num's
// throughput over den's, over the pairs where both passed. ok is false
// when either did not run or no pair passed.
func (rep *Report) Paired(num, den string) (lo, hi float64, ok bool) {
	a, b := rep.result(num), rep.result(den)
	if a == nil || b == nil {
		return 0, 0, false
	}
	for i := range min(len(a.Runs), len(b.Runs)) {
		x, y := a.Runs[i], b.Runs[i]
		if x.Error != "" || y.Error != "" || y.MsgsPerSec <= 0 {
			continue
		}
		r := x.MsgsPerSec / y.MsgsPerSec
		if !ok {
			lo, hi, ok = r, r, true
		}
		lo, hi = min(lo, r), max(hi, r)
	}
	return lo, hi, ok
}

// comparison is one idemq configuration against its baseline in one
// report, as the summary shows it.
type comparison struct {
	pair           string
	num, den       *Result
	ratio, lo, hi  float64 // medians' ratio; paired runs' range
	cpuNum, cpuDen float64 // user CPU per delivery, µs
	cpuRatio       float64
}

func (rep *Report) compare(num, den string) (comparison, bool) {
	a, b := rep.result(num), rep.result(den)
	if a == nil || b == nil || a.Failed != "" || b.Failed != "" || b.MsgsPerSec.Median <= 0 {
		return comparison{}, false
	}
	c := comparison{pair: rep.Pair(), num: a, den: b, ratio: a.MsgsPerSec.Median / b.MsgsPerSec.Median}
	c.lo, c.hi, _ = rep.Paired(num, den)
	c.cpuNum, c.cpuDen = a.UserCPU.Seconds()*1e6, b.UserCPU.Seconds()*1e6
	if c.cpuDen > 0 {
		c.cpuRatio = c.cpuNum / c.cpuDen
	}
	return c, true
}

func fmtRange(s Summary) string {
	return fmt.Sprintf("%s (%s–%s)", thousands(s.Median), thousands(s.Min), thousands(s.Max))
}

// thousands formats a rate with thousands separators.
func thousands(v float64) string { return humanize.Comma(int64(math.Round(v))) }

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "**missed**"
}

// WriteSummary writes, for reports of several broker and store pairs, the
// Markdown tables of idemq's targets: idemq-batch against hand-batch
// (medians with min–max, the lowest paired run, user CPU per delivery),
// idemq at batch size 1 against the seed pattern, and the other ratios
// (observed over bare, raw broker, Watermill) where the report ran them.
func WriteSummary(w io.Writer, reps []*Report) error {
	var b strings.Builder
	b.WriteString("| broker → store | hand-batch msgs/s | idemq-batch msgs/s | idemq / hand (≥ 1.00) | paired runs, lowest–highest (≥ 0.95) | user CPU per delivery, idemq / hand (≤ 1.10) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for _, rep := range reps {
		c, ok := rep.compare(IdemqBatch, HandBatch)
		if !ok {
			continue
		}
		pair := c.pair
		if rep.Params.BatchSize != 200 {
			pair += fmt.Sprintf(", batch %d", rep.Params.BatchSize)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f %s | %.2f–%.2f %s | %.1f / %.1f µs = %.2f %s |\n", pair,
			fmtRange(c.den.MsgsPerSec), fmtRange(c.num.MsgsPerSec), c.ratio, verdict(c.ratio >= 1),
			c.lo, c.hi, verdict(c.lo >= 0.95), c.cpuNum, c.cpuDen, c.cpuRatio, verdict(c.cpuRatio > 0 && c.cpuRatio <= 1.10))
	}
	var b1 strings.Builder
	for _, rep := range reps {
		for _, p := range [][2]string{{IdemqB1W5, SeedP5}, {IdemqB1W100C8, SeedP100W8}} {
			c, ok := rep.compare(p[0], p[1])
			if !ok {
				continue
			}
			fmt.Fprintf(&b1, "| %s | %s / %s | %s | %s | %.2f %s | %.2f–%.2f |\n", c.pair, p[0], p[1],
				fmtRange(c.den.MsgsPerSec), fmtRange(c.num.MsgsPerSec), c.ratio, verdict(c.ratio >= 1), c.lo, c.hi)
		}
	}
	if b1.Len() > 0 {
		b.WriteString("\n| broker → store | batch size 1 | seed msgs/s | idemq msgs/s | idemq / seed (≥ 1.00) | paired runs |\n")
		b.WriteString("|---|---|---:|---:|---:|---:|\n")
		b.WriteString(b1.String())
	}
	var other strings.Builder
	for _, rep := range reps {
		for _, o := range ObservedConfigs {
			if c, ok := rep.compare(o, IdemqBatch); ok {
				fmt.Fprintf(&other, "| %s | %s / idemq-batch | %.2f %s (≥ 0.90); user CPU per delivery %.1f / %.1f µs = %.2f %s (≤ 1.30) | %.2f–%.2f |\n",
					c.pair, o, c.ratio, verdict(c.ratio >= 0.9), c.cpuNum, c.cpuDen, c.cpuRatio, verdict(c.cpuRatio > 0 && c.cpuRatio <= 1.3), c.lo, c.hi)
			}
		}
		if c, ok := rep.compare(IdemqBatch, RawAck); ok {
			fmt.Fprintf(&other, "| %s | idemq-batch / raw-ack (%s msgs/s, no database) | %.2f %s (≥ 0.90) | %.2f–%.2f |\n",
				c.pair, thousands(c.den.MsgsPerSec.Median), c.ratio, verdict(c.ratio >= 0.9), c.lo, c.hi)
		}
		if c, ok := rep.compare(IdemqBatch, Watermill); ok {
			fmt.Fprintf(&other, "| %s | idemq-batch / watermill (%s msgs/s) | %.1f %s (≥ 8) | %.1f–%.1f |\n",
				c.pair, thousands(c.den.MsgsPerSec.Median), c.ratio, verdict(c.ratio >= 8), c.lo, c.hi)
		}
	}
	if other.Len() > 0 {
		b.WriteString("\n| broker → store | ratio | median | paired runs |\n|---|---|---|---:|\n")
		b.WriteString(other.String())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSummaryPNG draws, per broker and store pair, idemq-batch's
// throughput over hand-batch's (the medians' ratio, the bar's whisker the
// lowest and highest paired run) beside its user CPU per delivery over
// hand-batch's, with the 1.0 line, and saves it as a PNG at path.
func WriteSummaryPNG(path string, reps []*Report) error {
	var names []string
	var tput, cpu plotter.Values
	var pts plotter.XYs
	var errs plotter.YErrors
	for _, rep := range reps {
		c, ok := rep.compare(IdemqBatch, HandBatch)
		if !ok {
			continue
		}
		names = append(names, c.pair)
		tput = append(tput, c.ratio)
		cpu = append(cpu, c.cpuRatio)
		pts = append(pts, plotter.XY{X: float64(len(names) - 1), Y: c.ratio})
		errs = append(errs, struct{ Low, High float64 }{c.ratio - min(c.lo, c.ratio), max(c.hi, c.ratio) - c.ratio})
	}
	if len(names) == 0 {
		return errors.New("benchmark: WriteSummaryPNG: no report with idemq-batch and hand-batch")
	}
	p := plot.New()
	p.Title.Text = "idemq-batch / hand-batch, same run (medians; whisker: paired runs)"
	p.Y.Label.Text = "ratio"
	p.Y.Min = 0
	w := vg.Points(20)
	tb, err := newBars(tput, w, idemqBlue)
	if err != nil {
		return fmt.Errorf("benchmark: WriteSummaryPNG: %w", err)
	}
	cb, err := newBars(cpu, w, color.RGBA{R: 230, G: 140, B: 40, A: 255})
	if err != nil {
		return fmt.Errorf("benchmark: WriteSummaryPNG: %w", err)
	}
	cb.Offset = w // beside the throughput bar, which sits on the pair's tick with its whisker
	p.Add(tb, cb)
	p.Legend.Add("msgs/s (higher is better)", tb)
	p.Legend.Add("user CPU per delivery (lower is better)", cb)
	p.Legend.Top = true
	eb, err := newWhiskers(pts, errs)
	if err != nil {
		return fmt.Errorf("benchmark: WriteSummaryPNG: %w", err)
	}
	p.Add(eb)
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(names)) - 0.5, Y: 1}})
	if err != nil {
		return fmt.Errorf("benchmark: WriteSummaryPNG: %w", err)
	}
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	top := 1.0
	for i := range names {
		top = max(top, tput[i]+errs[i].High, cpu[i])
	}
	p.Y.Max = top * 1.25
	p.NominalX(names...)
	if err := p.Save(vg.Length(max(6, len(names)))*vg.Inch*1.6, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("benchmark: WriteSummaryPNG: %w", err)
	}
	return nil
}
