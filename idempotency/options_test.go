package idempotency

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/stores/sqlite"
)

// The middleware is a Pruner, for admin.Prune.
var _ admin.Pruner = (*Middleware[*sql.Tx])(nil)

// Every bad option fails New, each error naming its option; so does a
// store that cannot hold leases.
func TestNewRefusesBadConfig(t *testing.T) {
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = New(s, WithTable("no-dashes"), WithLease(1), WithMaxBody(0), WithScope(nil), WithName(""), WithStoredHeaders("ETag", ""), WithLogger(nil))
	if err == nil {
		t.Fatal("New took bad options")
	}
	for _, name := range []string{"WithTable", "WithLease", "WithMaxBody", "WithScope", "WithName", "WithStoredHeaders", "WithLogger"} {
		if !strings.Contains(err.Error(), "option "+name+":") {
			t.Errorf("the error does not name %s: %v", name, err)
		}
	}
	type noLeases struct{ driver.Store[*sql.Tx] }
	if _, err := New[*sql.Tx](noLeases{s}, WithScope(testScope)); err == nil || !strings.Contains(err.Error(), "driver.Leaser") {
		t.Fatalf("a store without leases: %v", err)
	}
	if _, err := New(s, WithName(strings.Repeat("n", 256))); err == nil || !strings.Contains(err.Error(), "WithName") {
		t.Fatalf("a 256-byte name: %v", err)
	}
	if _, err := New[*sql.Tx](nil); err == nil {
		t.Fatal("New took a nil store")
	}
	m, err := New(s, WithScope(testScope))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Prune(context.Background(), time.Now(), 0); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Prune with limit 0: %v", err)
	}
}
