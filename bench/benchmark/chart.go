package benchmark

import (
	"errors"
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WritePNG draws the throughput of each configuration that has one (median
// msgs/s, with the min–max range as an error bar) as a bar chart and saves
// it as a PNG at path, for docs/performance.md. Baselines are grey, idemq
// configurations blue; failed configurations are left out.
func (rep *Report) WritePNG(path string) error {
	var names []string
	var base, ours plotter.Values
	var lo, hi []float64
	for _, r := range rep.Results {
		if r.Failed != "" || r.MsgsPerSec.Median <= 0 {
			continue
		}
		names = append(names, r.Name)
		if r.Baseline {
			base = append(base, r.MsgsPerSec.Median)
			ours = append(ours, 0)
		} else {
			base = append(base, 0)
			ours = append(ours, r.MsgsPerSec.Median)
		}
		lo = append(lo, r.MsgsPerSec.Median-r.MsgsPerSec.Min)
		hi = append(hi, r.MsgsPerSec.Max-r.MsgsPerSec.Median)
	}
	if len(names) == 0 {
		return errors.New("benchmark: WritePNG: no configuration with a throughput to draw")
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("%d deliveries (%d unique), %d CPUs, load %.1f", rep.Params.Deliveries, rep.Params.N, rep.Machine.NumCPU, rep.Machine.LoadStart[0])
	p.Y.Label.Text = "messages per second (median of runs; bar = min–max)"
	p.Y.Min = 0
	w := vg.Points(22)

	bars, err := newBars(base, w, baselineGrey)
	if err != nil {
		return fmt.Errorf("benchmark: WritePNG: %w", err)
	}
	ourBars, err := newBars(ours, w, idemqBlue)
	if err != nil {
		return fmt.Errorf("benchmark: WritePNG: %w", err)
	}
	p.Add(bars, ourBars)
	p.Legend.Add("baseline (raw drivers)", bars)
	p.Legend.Add("idemq", ourBars)
	p.Legend.Top = true
	p.Legend.Left = true // above the seed bars, the shortest

	// Error bars and value labels sit at the bar positions 0..n-1.
	pts := make(plotter.XYs, len(names))
	errs := make(plotter.YErrors, len(names))
	labels := make([]string, len(names))
	for i := range names {
		v := base[i] + ours[i]
		pts[i] = plotter.XY{X: float64(i), Y: v}
		errs[i] = struct{ Low, High float64 }{lo[i], hi[i]}
		labels[i] = fmt.Sprintf("%.0f", v)
	}
	eb, err := newWhiskers(pts, errs)
	if err != nil {
		return fmt.Errorf("benchmark: WritePNG: %w", err)
	}
	p.Add(eb)
	lp := make(plotter.XYs, len(names))
	for i := range pts {
		lp[i] = plotter.XY{X: pts[i].X, Y: pts[i].Y + hi[i]}
	}
	lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: lp, Labels: labels})
	if err != nil {
		return fmt.Errorf("benchmark: WritePNG: %w", err)
	}
	for i := range lbl.TextStyle {
		lbl.TextStyle[i].XAlign = -0.5 // centred on the bar
		lbl.TextStyle[i].YAlign = 0    // just above it
	}
	p.Add(lbl)
	top := 0.0
	for i := range lp {
		top = max(top, lp[i].Y)
	}
	p.Y.Max = top * 1.15 // room for the tallest bar's label and the legend
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign = -1
	p.X.Tick.Label.YAlign = -0.5

	width := vg.Length(max(6, len(names))) * vg.Inch * 0.95
	if err := p.Save(width, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("benchmark: WritePNG: %w", err)
	}
	return nil
}

// The charts' colours: the baselines grey, idemq blue.
var (
	baselineGrey = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	idemqBlue    = color.RGBA{R: 40, G: 100, B: 200, A: 255}
)

// newBars returns a bar chart of vs, w wide, filled with c and unlined.
func newBars(vs plotter.Values, w vg.Length, c color.Color) (*plotter.BarChart, error) {
	b, err := plotter.NewBarChart(vs, w)
	if err != nil {
		return nil, err
	}
	b.Color = c
	b.LineStyle.Width = 0
	return b, nil
}

// newWhiskers returns error bars at pts, errs below and above each.
func newWhiskers(pts plotter.XYs, errs plotter.YErrors) (*plotter.YErrorBars, error) {
	return plotter.NewYErrorBars(struct {
		plotter.XYs
		plotter.YErrors
	}{pts, errs})
}
