package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/internal/sqlident"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// partitions remembers which partition starts this process has made sure
// of, so Begin only touches the catalog when time moves into a new period.
type partitions struct {
	mu    sync.Mutex
	known map[int64]bool // partition start, Unix seconds
}

// partitionsAhead is how many periods after the current one Migrate and
// Begin create in advance.
const partitionsAhead = 2

func newPartitionedStore(pool *pgxpool.Pool, cfg config, lockKey int64) *Store {
	t := cfg.Table
	return &Store{pool: pool, cfg: cfg, parts: partitions{known: map[int64]bool{}}, q: queries{
		lockKey: lockKey,
		// The primary key must hold the partition column; uniqueness of
		// (consumer, message_id) is kept by the advisory locks of Claim.
		migrate: migrateSQL(t, "consumer, message_id, processed_at", " PARTITION BY RANGE (processed_at)"),
		// One lock per id, taken in key order so that claimers of
		// overlapping batches cannot deadlock on each other. The key
		// prefixes the consumer with its length, so (consumer, id) pairs
		// cannot run into each other; a hash collision only makes two
		// claims wait for each other.
		lockIDs: `SELECT count(pg_advisory_xact_lock(k)) FROM (
	SELECT DISTINCT hashtextextended(length($1)::text || ':' || $1 || u.id, 0) AS k
	FROM unnest($2::text[]) AS u(id) ORDER BY k) AS keys`,
		// Runs after the locks are held, so its snapshot sees every claim
		// committed before: found ids come back with inserted = false and
		// their fingerprint, the rest are inserted.
		claim: `WITH input AS (
	SELECT u.id, u.fp, u.ord FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS u(id, fp, ord)
), existing AS (
	SELECT DISTINCT ON (message_id) message_id, fingerprint FROM ` + t + `
	WHERE consumer = $1 AND message_id = ANY($2::text[])
), ins AS (
	INSERT INTO ` + t + ` (consumer, message_id, fingerprint, processed_at)
	SELECT $1, i.id, i.fp, $4 FROM input i
	WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.message_id = i.id)
	ORDER BY i.ord
	ON CONFLICT DO NOTHING
	RETURNING message_id
)
SELECT message_id, '' AS fingerprint, true AS inserted FROM ins
UNION ALL
SELECT message_id, fingerprint, false FROM existing`,
		unclaim: `DELETE FROM ` + t + ` WHERE consumer = $1 AND message_id = ANY($2::text[])`,
		// As the plain table's prune, but by key: a ctid names a row only
		// within one partition. processed_at bounds the outer scan too, so
		// it touches only the partitions the victims are in.
		prune: `WITH gone AS (
	DELETE FROM ` + t + ` WHERE processed_at >= $3 AND processed_at < $1
	AND (consumer, message_id, processed_at) IN (
		SELECT consumer, message_id, processed_at FROM ` + t + ` WHERE processed_at >= $3 AND processed_at < $1
		ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)
	RETURNING processed_at
)
SELECT count(*), max(processed_at) FROM gone`,
	}}
}

// claimPartitioned is Claim on a partitioned table: lock the ids, then find
// and insert in one statement.
func (t *Txn) claimPartitioned(ctx context.Context, consumer string, claims []driver.Claim) ([]driver.ClaimResult, error) {
	results := make([]driver.ClaimResult, len(claims))
	if len(claims) == 0 {
		return results, nil
	}
	ids := make([]string, len(claims))
	fps := make([]string, len(claims))
	for i, c := range claims {
		ids[i], fps[i] = c.ID, c.Fingerprint
	}
	if _, err := t.tx.Exec(ctx, t.s.q.lockIDs, consumer, texts(ids)); err != nil {
		return nil, fmt.Errorf("postgres: claim: lock %d ids for %q: %w", len(ids), consumer, err)
	}
	rows, err := t.tx.Query(ctx, t.s.q.claim, customPlan, consumer, texts(ids), texts(fps), t.s.cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("postgres: claim %d ids for %q: %w", len(ids), consumer, err)
	}
	type found struct {
		fp       string
		inserted bool
	}
	got := make(map[string]found, len(ids))
	for rows.Next() {
		var id string
		var f found
		if err := rows.Scan(&id, &f.fp, &f.inserted); err != nil {
			rows.Close()
			return nil, fmt.Errorf("postgres: claim: %w", err)
		}
		got[id] = f
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: claim %d ids for %q: %w", len(ids), consumer, err)
	}
	for i, c := range claims {
		f, ok := got[c.ID]
		switch {
		case !ok:
			return nil, fmt.Errorf("postgres: claim: id %q was neither found nor inserted", c.ID)
		case f.inserted:
			results[i] = driver.ClaimWon
		default:
			results[i] = driver.ClassifyStored(c.Fingerprint, f.fp)
		}
	}
	return results, nil
}

// periodStart is the start of the partition period holding at.
func (s *Store) periodStart(at time.Time) time.Time {
	p := int64(s.cfg.period / time.Second)
	u := at.Unix()
	start := u - ((u%p)+p)%p // floor, also before 1970
	return time.Unix(start, 0).UTC()
}

// partitionName derives a partition's table name from its start, within
// the 63-byte identifier limit.
func (s *Store) partitionName(start time.Time) string {
	suffix := "_p" + start.UTC().Format("20060102t1504")
	prefix := s.cfg.Table
	if len(prefix)+len(suffix) > sqlident.MaxLength {
		h := fnv.New32a()
		h.Write([]byte(prefix))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		prefix = prefix[:sqlident.MaxLength-len(suffix)-len(tag)] + tag
	}
	return prefix + suffix
}

// ensurePartitions creates the partitions for the period holding at and
// the next partitionsAhead periods, unless this process already did.
func (s *Store) ensurePartitions(ctx context.Context, at time.Time) error {
	first := s.periodStart(at)
	var need []time.Time
	s.parts.mu.Lock()
	for i := 0; i <= partitionsAhead; i++ {
		start := first.Add(time.Duration(i) * s.cfg.period)
		if !s.parts.known[start.Unix()] {
			need = append(need, start)
		}
	}
	s.parts.mu.Unlock()
	if len(need) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The same lock as Migrate and DropPartitions: two processes
		// creating the same partition, or one creating while another
		// drops, take turns.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.q.lockKey); err != nil {
			return err
		}
		for _, start := range need {
			end := start.Add(s.cfg.period)
			stmt := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
				s.partitionName(start), s.cfg.Table, start.Format(time.RFC3339), end.Format(time.RFC3339))
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: create partitions of %s: %w", s.cfg.Table, err)
	}
	s.parts.mu.Lock()
	for _, start := range need {
		s.parts.known[start.Unix()] = true
	}
	s.parts.mu.Unlock()
	return nil
}

// boundRE reads a range partition's bounds as pg_get_expr prints them with
// TimeZone set to UTC.
var boundRE = regexp.MustCompile(`^FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)$`)

// Partition is one partition of a partitioned dedup table.
type Partition struct {
	Name       string
	Start, End time.Time // rows with Start <= processed_at < End
}

// Partitions lists the partitions of a table made WithPartitions, oldest
// first.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	var out []Partition
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = listPartitions(ctx, tx, s.cfg.Table)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: partitions of %s: %w", s.cfg.Table, err)
	}
	return out, nil
}

func listPartitions(ctx context.Context, tx pgx.Tx, table string) ([]Partition, error) {
	if _, err := tx.Exec(ctx, `SET LOCAL TimeZone = 'UTC'`); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var name string
		var bound *string // NULL for a partition being dropped concurrently
		if err := rows.Scan(&name, &bound); err != nil {
			return nil, err
		}
		if bound == nil {
			continue
		}
		m := boundRE.FindStringSubmatch(*bound)
		if m == nil {
			continue // DEFAULT or MINVALUE/MAXVALUE bounds: never ours to drop
		}
		const layout = "2006-01-02 15:04:05-07"
		start, err1 := time.Parse(layout, m[1])
		end, err2 := time.Parse(layout, m[2])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Partition{Name: name, Start: start, End: end})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Partition) int { return a.Start.Compare(b.Start) })
	return out, nil
}

// DropPartitions drops the partitions of a table made WithPartitions whose
// every row is older than before (End <= before) and returns how many it
// dropped. Each DROP waits at most 5s for the locks of running claims, then
// gives up for this round. The claims in those partitions are gone, as with
// Prune. On an unpartitioned table it does nothing.
func (s *Store) DropPartitions(ctx context.Context, before time.Time) (int, error) {
	if s.cfg.period == 0 {
		return 0, nil
	}
	dropped := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.q.lockKey); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		parts, err := listPartitions(ctx, tx, s.cfg.Table)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if p.End.After(before) {
				break
			}
			// The name came from the catalog; it is one of ours, but quote
			// it anyway.
			if _, err := tx.Exec(ctx, `DROP TABLE `+pgx.Identifier{p.Name}.Sanitize()); err != nil {
				return err
			}
			dropped++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("postgres: drop partitions of %s: %w", s.cfg.Table, err)
	}
	s.parts.mu.Lock()
	for start := range s.parts.known {
		if !time.Unix(start, 0).Add(s.cfg.period).After(before) {
			delete(s.parts.known, start)
		}
	}
	s.parts.mu.Unlock()
	return dropped, nil
}

// runPartitionUpkeep is RunPruner for a partitioned table: it also
// deletes the leases that expired before the cut, batch rows a statement.
func (s *Store) runPartitionUpkeep(ctx context.Context, every time.Duration, batch int, logger *slog.Logger) error {
	if every <= 0 {
		return fmt.Errorf("RunPruner: every must be positive, got %v", every)
	}
	if logger == nil {
		logger = slog.Default()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		now := s.cfg.Now()
		if err := s.ensurePartitions(ctx, now); err != nil && ctx.Err() == nil {
			logger.WarnContext(ctx, "idemq: creating partitions failed", "table", s.cfg.Table, "err", err)
		}
		cut := now.Add(-s.cfg.Retention)
		n, err := s.DropPartitions(ctx, cut)
		switch {
		case err != nil && ctx.Err() == nil:
			logger.WarnContext(ctx, "idemq: dropping partitions failed", "table", s.cfg.Table, "err", err)
		case n > 0:
			logger.InfoContext(ctx, "idemq: dropped partitions", "table", s.cfg.Table, "partitions", n, "before", cut)
		}
		s.pruneExpiredLeases(ctx, cut, batch, logger)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// pruneExpiredLeases deletes the leases that expired before cut, batch
// rows a statement until a statement comes back short, and logs how many
// it removed or why it stopped.
func (s *Store) pruneExpiredLeases(ctx context.Context, cut time.Time, batch int, logger *slog.Logger) {
	total := 0
	for batch > 0 {
		n, err := s.pruneLeases(ctx, cut, batch)
		if err != nil {
			if ctx.Err() == nil {
				logger.WarnContext(ctx, "idemq: pruning expired leases failed", "table", s.cfg.Table, "err", err)
			}
			break
		}
		total += n
		if n < batch {
			break
		}
	}
	if total > 0 {
		logger.InfoContext(ctx, "idemq: pruned expired leases", "table", s.cfg.Table, "rows", total, "before", cut)
	}
}
