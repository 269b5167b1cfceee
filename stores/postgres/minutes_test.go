package postgres_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/stores/postgres"
	"github.com/idemq/idemq/stores/storetest"
)

// TestClaimsPerMinute: the claims of the last hour are counted by
// consumer and minute, on a range of the processed_at index read newest
// first that stops at the limit (EXPLAIN ANALYZE: backward index scans,
// no sequential scan, no more rows read than the limit), for a plain and
// a partitioned table.
func TestClaimsPerMinute(t *testing.T) {
	newest := time.Now().UTC().Truncate(time.Minute).Add(30 * time.Second)
	// The partitions Migrate makes start at the clock's hour: two hours
	// back, so that every row has one.
	clock := func() time.Time { return newest.Add(-2 * time.Hour) }
	for name, opts := range map[string][]postgres.Option{
		"plain":       nil,
		"partitioned": {postgres.WithPartitions(time.Hour), postgres.WithClock(clock)},
	} {
		t.Run(name, func(t *testing.T) {
			pool := testPool(t)
			s := openStore(t, pool, opts...)
			ctx := context.Background()
			r := storetest.MinuteRows{N: 20000, Newest: newest, Step: 360 * time.Millisecond}
			if _, err := pool.Exec(ctx, `INSERT INTO `+s.Table()+` (consumer, message_id, processed_at)
SELECT 'c' || (n % 2), 'id-' || n, $2::timestamptz - n * $3::interval FROM generate_series(0, $1::int - 1) n`,
				r.N, r.Newest, r.Step); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `ANALYZE `+s.Table()); err != nil {
				t.Fatal(err)
			}
			storetest.CheckClaimsPerMinute(t, s, r)

			const limit = 500
			rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+postgres.ClaimsPerMinuteSQL(s.Table()),
				r.Newest.Truncate(time.Minute).Add(-59*time.Minute), limit)
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				lines = append(lines, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			plan := strings.Join(lines, "\n")
			t.Logf("plan:\n%s", plan)
			scans := regexp.MustCompile(`Index (?:Only )?Scan Backward using \S+ on \S+.*rows=(\d+)`).FindAllStringSubmatch(plan, -1)
			if len(scans) == 0 || strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Limit") {
				t.Fatalf("the plan does not read the processed_at index backward under a limit:\n%s", plan)
			}
			read := 0
			for _, m := range scans {
				n, _ := strconv.Atoi(m[1])
				read += n
			}
			if read > limit+len(scans) {
				t.Errorf("the index scans read %d rows, want at most the limit %d (and one more per partition):\n%s", read, limit, plan)
			}
		})
	}
}
