package mysql_test

import (
	"context"
	"database/sql"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/storetest"
)

// TestPoolIsBounded: the pool Open makes holds at most pool_max_conns
// connections (default 32, or four per CPU where that is more), however
// many transactions are asked for at once, and keeps that many idle; a
// bound below 1 is refused at start-up, named.
func TestPoolIsBounded(t *testing.T) {
	ctx := context.Background()
	table := storetest.UniqueName("idemq_pool_")
	base := storeURL(t) + "&table=" + table
	for _, c := range []struct {
		url  string
		want int
	}{{base, max(32, 4*runtime.NumCPU())}, {base + "&pool_max_conns=3", 3}} {
		st, err := core.OpenStore[*sql.Tx](ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		db := st.(*mysql.Store).DB()
		if got := db.Stats().MaxOpenConnections; got != c.want {
			t.Errorf("%s: MaxOpenConnections %d, want %d", c.url, got, c.want)
		}
		// More transactions at once than the bound, each held a moment:
		// never more connections than the bound, and no fresh connection
		// per transaction once the pool is warm.
		var wg sync.WaitGroup
		for range c.want + 10 {
			wg.Go(func() {
				txn, err := st.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(20 * time.Millisecond)
				if err := txn.Rollback(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		s := db.Stats()
		if s.OpenConnections > c.want || s.WaitCount == 0 {
			t.Errorf("%s: %d connections open, %d waits for one; want at most %d, and waits", c.url, s.OpenConnections, s.WaitCount, c.want)
		}
		if s.MaxIdleClosed != 0 {
			t.Errorf("%s: %d connections closed for want of idle room, want none", c.url, s.MaxIdleClosed)
		}
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_leases`)
		st.Close()
	}
	_, err := core.OpenStore[*sql.Tx](ctx, base+"&pool_max_conns=0")
	if err == nil || !strings.Contains(err.Error(), "pool_max_conns") {
		t.Errorf("pool_max_conns=0: %v, want it refused naming pool_max_conns", err)
	}
}
