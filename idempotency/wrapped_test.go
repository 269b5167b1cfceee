package idempotency

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"net/http"
	"net/url"
	"testing"

	mysqldrv "github.com/go-sql-driver/mysql"
	msqlite "modernc.org/sqlite"

	"github.com/idemq/idemq/internal/servicetest"
	"github.com/idemq/idemq/stores/mysql"
	"github.com/idemq/idemq/stores/sqlite"
	"github.com/idemq/idemq/stores/storetest"
)

// tracedDriver stands for an instrumenting database/sql wrapper (otelsql,
// sqlcommenter and the like): a driver of its own type around the real
// one, whose type then tells nothing of the database.
type tracedDriver struct{ real sqldriver.Driver }

func (d tracedDriver) Open(name string) (sqldriver.Conn, error) { return d.real.Open(name) }

// tracedConnector opens connections of dsn through a tracedDriver.
type tracedConnector struct {
	d   tracedDriver
	dsn string
}

func (c tracedConnector) Connect(context.Context) (sqldriver.Conn, error) { return c.d.Open(c.dsn) }
func (c tracedConnector) Driver() sqldriver.Driver                        { return c.d }

// A MySQL or SQLite store over a wrapped driver is served like any other:
// the middleware asks the store what it is, never the driver's type.
func TestWrappedDriver(t *testing.T) {
	ctx := context.Background()
	for _, backend := range []string{"mysql", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			n := newNames(t)
			var s interface {
				sqlStore
				Migrate(context.Context) error
			}
			var err error
			if backend == "mysql" {
				cfg, perr := mysql.ParseDSN(servicetest.MySQLURL(t))
				if perr != nil {
					t.Fatal(perr)
				}
				db := sql.OpenDB(tracedConnector{tracedDriver{&mysqldrv.MySQLDriver{}}, cfg.FormatDSN()})
				t.Cleanup(func() { db.Close() })
				s, err = mysql.New(db, mysql.WithTable(n.Claims))
			} else {
				q := url.Values{"_pragma": {"busy_timeout(5000)", "journal_mode(WAL)"}, "_txlock": {"immediate"}}
				db := sql.OpenDB(tracedConnector{tracedDriver{&msqlite.Driver{}}, n.SQLitePath + "?" + q.Encode()})
				t.Cleanup(func() { db.Close() })
				s, err = sqlite.New(db, sqlite.WithTable(n.Claims))
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			f := openSQL(t, backend, s, n, true, []Option{WithTable(n.Responses), WithScope(testScope)})
			order := storetest.UniqueName("o")
			url := serve(t, f.handler(f.orders()))
			body := `{"order":"` + order + `"}`
			if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first: %d %v %s", a.status, a.header, a.body)
			}
			if a := post(t, url, "k-"+order, body); a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d %v %s", a.status, a.header, a.body)
			}
			if got := f.count(order); got != 1 {
				t.Fatalf("%d effects, want 1", got)
			}
		})
	}
}
