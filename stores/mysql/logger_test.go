package mysql_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// lockedBuffer is a buffer written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The driver's own lines come out as structured records through the
// Store's logger (WithLogger), not through go-sql-driver's process-wide
// logger (stderr unless mysql.SetLogger says otherwise): a pooled
// connection the server killed while idle is found bad when taken again
// ("closing bad idle connection"), and the store goes on with a new one.
func TestDriverLogThroughTheStoresLogger(t *testing.T) {
	var global lockedBuffer
	mysqldrv.SetLogger(log.New(&global, "[mysql] ", 0))
	t.Cleanup(func() { mysqldrv.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime)) })
	ctx := context.Background()
	var out lockedBuffer
	table := storetest.UniqueName("idemq_my_")
	s, err := mysql.Open(ctx, mysqlDSN(t), mysql.WithTable(table), mysql.WithLogger(slog.New(slog.NewJSONHandler(&out, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := testDB(t)
	t.Cleanup(func() { admin.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`) })
	db := s.DB()
	db.SetMaxOpenConns(1) // the next statement takes the killed connection
	var id int64
	if err := db.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, fmt.Sprintf(`KILL %d`, id)); err != nil {
		t.Fatalf("KILL %d: %v", id, err)
	}
	servicetest.WaitFor(t, 10*time.Second, "the killed connection gone from the server", func() bool {
		var n int
		return admin.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = ?`, id).Scan(&n) == nil && n == 0
	})
	var one int
	if err := db.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Fatalf("the statement after the kill: %v", err)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			t.Errorf("not a JSON record: %q", line)
			continue
		}
		if l, _ := rec["line"].(string); rec["level"] == "WARN" && rec["msg"] == "idemq mysql: go-sql-driver log" && strings.Contains(l, "bad idle connection") {
			found = true
		}
	}
	if !found {
		t.Errorf("no structured record of the bad idle connection through the store's logger; it got:\n%s", out.String())
	}
	if g := global.String(); g != "" {
		t.Errorf("go-sql-driver's process-wide logger got lines: %s", g)
	}
}
