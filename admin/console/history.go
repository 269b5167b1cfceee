package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver/retry"
)

// historyMinutes is how many minutes of each consumer's decisions the
// console keeps: the current one and those before it.
const historyMinutes = 60

// ring is a ring buffer that holds the last values pushed, as many as its
// size, and drops the oldest to take a new one.
type ring[T any] struct {
	buf  []T
	next int // where the next value goes
	n    int // values held
}

// newRing returns an empty ring of size values; size is at least 1.
func newRing[T any](size int) *ring[T] {
	return &ring[T]{buf: make([]T, size)}
}

// push adds v, dropping the oldest value when the ring is full.
func (r *ring[T]) push(v T) {
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	if r.n < len(r.buf) {
		r.n++
	}
}

// last returns the newest value, nil when the ring is empty.
func (r *ring[T]) last() *T {
	if r.n == 0 {
		return nil
	}
	return &r.buf[(r.next-1+len(r.buf))%len(r.buf)]
}

// values returns a copy of the values held, oldest first.
func (r *ring[T]) values() []T {
	out := make([]T, 0, r.n)
	for i := range r.n {
		out = append(out, r.buf[(r.next-r.n+i+len(r.buf))%len(r.buf)])
	}
	return out
}

// minuteCount is what one minute adds to a consumer's decisions.
type minuteCount struct {
	Minute     int64 // minutes since the Unix epoch
	Processed  int64
	Duplicates int64
}

// history is one consumer's sampled decisions: per minute, the last
// historyMinutes of them.
type history struct {
	mu      sync.Mutex
	started time.Time // the first sample
	sampled time.Time // the last sample
	last    core.Stats
	minutes *ring[minuteCount]
}

func newHistory() *history {
	return &history{minutes: newRing[minuteCount](historyMinutes)}
}

// unixMinute is t's minute since the Unix epoch.
func unixMinute(t time.Time) int64 {
	return t.Truncate(time.Minute).Unix() / 60
}

// record takes the sample s taken at at. The first sample is the
// baseline: what the consumer decided before it is counted in its totals
// only. A counter that goes back (another Consumer behind the same Stats)
// adds nothing.
func (h *history) record(at time.Time, s core.Stats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var dp, dd int64
	if h.started.IsZero() {
		h.started = at
	} else {
		dp = max(s.Processed-h.last.Processed, 0)
		dd = max(s.Duplicates-h.last.Duplicates, 0)
	}
	h.last, h.sampled = s, at
	m := unixMinute(at)
	if l := h.minutes.last(); l != nil && l.Minute >= m {
		l.Processed += dp
		l.Duplicates += dd
		return
	}
	h.minutes.push(minuteCount{Minute: m, Processed: dp, Duplicates: dd})
}

// overTimeView is a consumer's decisions over time on the overview.
type overTimeView struct {
	Total          core.Stats // since the consumer started
	HourProcessed  int64      // in the minutes kept
	HourDuplicates int64
	Minutes        int // minutes kept
	Since          time.Time
	SampledAt      time.Time
	Spark          sparkline
}

// sparkline is an inline SVG of the processed messages and duplicates per
// minute: one slot per minute kept, the newest (still counting) on the
// right. Without duplicates (claims from the store) it draws one line.
type sparkline struct {
	W, H                  int
	BaselineY             int
	Processed, Duplicates string // polyline points; Duplicates "" when not known
	PX, PY, DX, DY        string // the newest points
	Max                   int64  // per minute, the top of the scale
	Title                 string
}

// Sparkline geometry: pixels per minute and the height.
const (
	sparkStep   = 3
	sparkHeight = 32
	sparkPad    = 2
)

// view returns what the overview shows of h, with total the consumer's
// counts now.
func (h *history) view(total core.Stats) *overTimeView {
	h.mu.Lock()
	mins := h.minutes.values()
	v := &overTimeView{Total: total, Since: h.started, SampledAt: h.sampled}
	h.mu.Unlock()
	v.Minutes = len(mins)
	for _, m := range mins {
		v.HourProcessed += m.Processed
		v.HourDuplicates += m.Duplicates
	}
	v.Spark = spark(mins, true)
	return v
}

// spark draws mins (oldest first, ascending minutes) in historyMinutes
// slots ending at the newest minute; minutes without a sample count 0.
// Without duplicates it draws the processed line only, and calls it
// claims.
func spark(mins []minuteCount, duplicates bool) sparkline {
	s := sparkline{W: historyMinutes * sparkStep, H: sparkHeight, Max: 1}
	s.BaselineY = sparkHeight - 1
	if len(mins) == 0 {
		s.Title = "no samples yet"
		return s
	}
	end := mins[len(mins)-1].Minute
	first := max(mins[0].Minute, end-historyMinutes+1)
	by := make(map[int64]minuteCount, len(mins))
	for _, m := range mins {
		by[m.Minute] = m
		s.Max = max(s.Max, m.Processed, m.Duplicates)
	}
	var p, d strings.Builder
	for minute := first; minute <= end; minute++ {
		slot := int(minute - (end - historyMinutes + 1))
		x := fmt.Sprintf("%d", slot*sparkStep+1)
		m := by[minute]
		py, dy := s.y(m.Processed), s.y(m.Duplicates)
		fmt.Fprintf(&p, "%s,%s ", x, py)
		fmt.Fprintf(&d, "%s,%s ", x, dy)
		s.PX, s.PY, s.DX, s.DY = x, py, x, dy
	}
	s.Processed, s.Duplicates = strings.TrimSpace(p.String()), strings.TrimSpace(d.String())
	last := mins[len(mins)-1]
	span := "1 minute"
	if n := end - first + 1; n > 1 {
		span = fmt.Sprintf("%d minutes", n)
	}
	if !duplicates {
		s.Duplicates = ""
		s.Title = fmt.Sprintf("claims per minute over %s, at most %d a minute; this minute so far: %d", span, s.Max, last.Processed)
		return s
	}
	s.Title = fmt.Sprintf("processed (blue) and duplicates (red) per minute over %s, at most %d a minute; this minute so far: %d processed, %d duplicates",
		span, s.Max, last.Processed, last.Duplicates)
	return s
}

// recentView is a consumer's claims per minute over the last hour as the
// store recorded them, on the overview of a consumer without
// Consumer.Stats.
type recentView struct {
	Claims  int64 // in the minutes counted
	Minutes int   // minutes counted, the current one included
	Capped  bool  // fewer than the hour: the store had more claims than the count reads
	Spark   sparkline
}

// recentFor returns the store's claims per minute over the last hour,
// asking the store again when they are older than Config.SampleEvery; nil
// when every consumer has Stats or the store cannot count them
// (errors.ErrUnsupported).
func (h *handler) recentFor(ctx context.Context) *counted[admin.RecentClaims] {
	if !slices.ContainsFunc(h.order, func(c *consumerState) bool { return c.hist == nil }) {
		return nil
	}
	c := h.recent.get(ctx, h.cfg.SampleEvery, 30*time.Second, func(ctx context.Context) (admin.RecentClaims, error) {
		since := time.Now().Truncate(time.Minute).Add(-(historyMinutes - 1) * time.Minute)
		return h.cfg.Store.ClaimsPerMinute(ctx, since, admin.RecentCap)
	})
	if errors.Is(c.err, errors.ErrUnsupported) {
		return nil
	}
	return c
}

// recentOf returns consumer's claims per minute in s, from the minute the
// count starts to the current one.
func recentOf(s *counted[admin.RecentClaims], consumer string) *recentView {
	by := map[int64]int64{}
	for _, m := range s.V.Minutes {
		if m.Consumer == consumer {
			by[unixMinute(m.Minute)] += m.Claims
		}
	}
	v := &recentView{Capped: s.V.Capped}
	var mins []minuteCount
	for m := unixMinute(s.V.Since); m <= unixMinute(s.At); m++ {
		mins = append(mins, minuteCount{Minute: m, Processed: by[m]})
		v.Claims += by[m]
	}
	v.Minutes = len(mins)
	v.Spark = spark(mins, false)
	return v
}

// y is the height of v per minute in s.
func (s sparkline) y(v int64) string {
	top, bottom := float64(sparkPad), float64(sparkHeight-sparkPad)
	return fmt.Sprintf("%.1f", bottom-(bottom-top)*float64(v)/float64(s.Max))
}

// startSampler takes each consumer's first sample, then samples every
// Config.SampleEvery in a goroutine of its own until Config.Context
// ends. It does nothing when no consumer has Stats.
func (h *handler) startSampler() {
	var sampled []*consumerState
	for _, c := range h.order {
		if c.hist != nil {
			sampled = append(sampled, c)
		}
	}
	if len(sampled) == 0 {
		return
	}
	sampleAll := func(time.Time) {
		for _, c := range sampled {
			s := c.Stats()
			c.hist.record(time.Now(), s)
		}
	}
	sampleAll(time.Time{})
	h.samplerDone = make(chan struct{})
	go func() {
		defer close(h.samplerDone)
		retry.Every(h.cfg.Context, h.cfg.SampleEvery, sampleAll)
	}()
}
