package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
)

// MinuteRows describes the claims a store's test inserts before it calls
// CheckClaimsPerMinute: row i, for i from 0 to N-1, is the claim of
// consumer "c<i%2>" on message "id-<i>", recorded Step×i before Newest.
type MinuteRows struct {
	N      int
	Newest time.Time
	Step   time.Duration
}

// At is when row i was recorded.
func (r MinuteRows) At(i int) time.Time { return r.Newest.Add(-time.Duration(i) * r.Step) }

// want counts rows by consumer and minute, those recorded at or after
// since.
func (r MinuteRows) want(since time.Time) map[string]int64 {
	w := map[string]int64{}
	for i := range r.N {
		if at := r.At(i); !at.Before(since) {
			w[fmt.Sprintf("c%d %s", i%2, at.UTC().Truncate(time.Minute).Format(time.RFC3339))]++
		}
	}
	return w
}

// CheckClaimsPerMinute checks a store's ClaimsPerMinute on the rows r
// describes: every claim since a minute is counted in its consumer's
// minute, and with a limit, only the newest claims, that many.
func CheckClaimsPerMinute(t *testing.T, mc admin.MinuteCounter, r MinuteRows) {
	t.Helper()
	ctx := context.Background()
	since := r.Newest.Truncate(time.Minute).Add(-59 * time.Minute)
	want := r.want(since)
	ms, err := mc.ClaimsPerMinute(ctx, since, r.N+1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, m := range ms {
		if m.Minute.Second() != 0 || m.Minute.Nanosecond() != 0 {
			t.Errorf("minute %v does not start a minute", m.Minute)
		}
		got[fmt.Sprintf("%s %s", m.Consumer, m.Minute.UTC().Format(time.RFC3339))] += m.Claims
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claims per consumer and minute since %v:\n got %v\nwant %v", since, got, want)
	}

	// With a limit: the newest claims only, as many as the limit.
	const limit = 500
	ms, err = mc.ClaimsPerMinute(ctx, since, limit)
	if err != nil {
		t.Fatal(err)
	}
	newestLeft := r.At(limit - 1).Truncate(time.Minute)
	var total int64
	for _, m := range ms {
		total += m.Claims
		if m.Minute.Before(newestLeft) {
			t.Errorf("with limit %d: claims of %v counted, older than the newest %d claims", limit, m.Minute, limit)
		}
	}
	if total != limit {
		t.Errorf("with limit %d: %d claims counted", limit, total)
	}
	if _, err := mc.ClaimsPerMinute(ctx, since, 0); err == nil {
		t.Error("ClaimsPerMinute with limit 0: no error")
	}
}
