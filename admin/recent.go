package admin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// RecentCap is the most claims Store.ClaimsPerMinute reads: a busier
// table has its newest minutes counted whole, and the older ones left out
// (RecentClaims.Capped).
const RecentCap = 100_000

// MinuteClaims is how many claims one consumer recorded in one minute.
type MinuteClaims struct {
	Consumer string
	// Minute is the minute's start, in UTC.
	Minute time.Time
	Claims int64
}

// MinuteCounter is implemented by stores that can count their newest
// claims per consumer and minute cheaply. ClaimsPerMinute counts, by
// consumer and by the minute of processed_at, the newest claims recorded
// at or after since, at most limit of them: a range read of the
// processed_at index that pruning uses, newest first, that stops after
// limit entries whatever the table's size. It takes no locks that block
// claims. The minutes come in no order; those without a claim are left
// out.
type MinuteCounter interface {
	ClaimsPerMinute(ctx context.Context, since time.Time, limit int) ([]MinuteClaims, error)
}

// RecentClaims is what a store recorded per consumer and minute since a
// time, as Store.ClaimsPerMinute counts it.
type RecentClaims struct {
	// Since is the start of the first minute counted: the minute asked
	// for, or a later one when Capped.
	Since time.Time
	// Capped reports that more claims were recorded since the minute
	// asked for than the count reads: only the minutes from Since on are
	// counted, each whole.
	Capped bool
	// Minutes are the counts, oldest first, then by consumer; minutes
	// without a claim are left out.
	Minutes []MinuteClaims
}

// ClaimsPerMinute counts the claims recorded per consumer and minute from
// the minute of since on, reading at most limit claims (MinuteCounter):
// when more were recorded, the oldest minutes are left out and the oldest
// minute it reached, which it read in part, too (RecentClaims.Capped). It
// is the store's own record of what every consumer processed, cheap
// enough to ask every few seconds.
func (s *Store) ClaimsPerMinute(ctx context.Context, since time.Time, limit int) (RecentClaims, error) {
	mc, ok := s.store.(MinuteCounter)
	if !ok {
		return RecentClaims{}, s.unsupported("count its claims per minute")
	}
	r := RecentClaims{Since: since.UTC().Truncate(time.Minute)}
	if limit <= 0 {
		return r, fmt.Errorf("idemq: ClaimsPerMinute: limit must be positive, got %d", limit)
	}
	// One more than limit tells a table with exactly limit claims from
	// one with more.
	ms, err := mc.ClaimsPerMinute(ctx, r.Since, limit+1)
	if err != nil {
		return r, s.hide(err)
	}
	var total int64
	var oldest time.Time
	for i := range ms {
		ms[i].Minute = ms[i].Minute.UTC()
		total += ms[i].Claims
		if oldest.IsZero() || ms[i].Minute.Before(oldest) {
			oldest = ms[i].Minute
		}
	}
	if total > int64(limit) {
		r.Capped = true
		r.Since = oldest.Add(time.Minute)
	}
	for _, m := range ms {
		if !m.Minute.Before(r.Since) {
			r.Minutes = append(r.Minutes, m)
		}
	}
	slices.SortFunc(r.Minutes, func(a, b MinuteClaims) int {
		return cmp.Or(a.Minute.Compare(b.Minute), strings.Compare(a.Consumer, b.Consumer))
	})
	return r, nil
}
