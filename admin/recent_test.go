package admin_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"

	_ "github.com/idemq/idemq/stores/sqlite"
)

// Store.ClaimsPerMinute on SQLite: every minute since the one asked for,
// oldest first; past the limit, only the minutes it read whole.
func TestClaimsPerMinute(t *testing.T) {
	ctx := context.Background()
	s, err := admin.OpenStore(ctx, "sqlite://"+filepath.Join(t.TempDir(), "claims.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var db *sql.DB
	if !s.As(&db) {
		t.Fatal("no *sql.DB")
	}
	m0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	// a: 5 claims in m0, 3 in m0+1, 2 in m0+2; b: 1 in m0+1; one claim
	// of a before m0, which is not asked for.
	n := 0
	claim := func(consumer string, at time.Time) {
		n++
		if _, err := db.ExecContext(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at) VALUES (?, ?, ?)`,
			consumer, fmt.Sprint("id-", n), at.Format("2006-01-02 15:04:05.000000")); err != nil {
			t.Fatal(err)
		}
	}
	claim("a", m0.Add(-time.Second))
	for i, k := range []int{5, 3, 2} {
		for j := range k {
			claim("a", m0.Add(time.Duration(i)*time.Minute+time.Duration(j)*time.Second))
		}
	}
	claim("b", m0.Add(time.Minute+30*time.Second))

	for _, c := range []struct {
		limit  int
		capped bool
		since  time.Time
		want   string
	}{
		{100, false, m0, "a 10:00 5, a 10:01 3, b 10:01 1, a 10:02 2"},
		{11, false, m0, "a 10:00 5, a 10:01 3, b 10:01 1, a 10:02 2"},
		{10, true, m0.Add(time.Minute), "a 10:01 3, b 10:01 1, a 10:02 2"},
		{6, true, m0.Add(time.Minute), "a 10:01 3, b 10:01 1, a 10:02 2"},
		{5, true, m0.Add(2 * time.Minute), "a 10:02 2"},
		{1, true, m0.Add(3 * time.Minute), ""},
	} {
		r, err := s.ClaimsPerMinute(ctx, m0.Add(40*time.Second), c.limit)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for i, m := range r.Minutes {
			if i > 0 {
				got += ", "
			}
			got += fmt.Sprintf("%s %s %d", m.Consumer, m.Minute.Format("15:04"), m.Claims)
		}
		if got != c.want || r.Capped != c.capped || !r.Since.Equal(c.since) {
			t.Errorf("limit %d: %q, capped %v, since %v; want %q, %v, %v", c.limit, got, r.Capped, r.Since, c.want, c.capped, c.since)
		}
	}
	if _, err := s.ClaimsPerMinute(ctx, m0, 0); err == nil {
		t.Error("limit 0: no error")
	}
}
