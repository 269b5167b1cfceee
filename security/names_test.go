package security

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/brokers/memory"
	"github.com/idemq/idemq/brokers/rabbitmq"
	"github.com/idemq/idemq/core"
	_ "github.com/idemq/idemq/stores/mysql"
	_ "github.com/idemq/idemq/stores/postgres"
	_ "github.com/idemq/idemq/stores/sqlite"
)

// hostileNames are table, queue and consumer names an attacker who
// controls configuration might try: SQL injection, quoting tricks,
// control bytes, overlong names.
var hostileNames = []string{
	"x; DROP TABLE processed_messages; --",
	`x" OR "1"="1`,
	"x`y",
	"pm\x00",
	"pm\xff",
	"pm name",
	"1pm",
	strings.Repeat("t", 64),
	"",
}

// TestHostileNamesRefusedAtStartUp: every store refuses a table name that
// is not a plain SQL identifier before it connects or touches a file, with
// an error naming the option; the Consumer refuses hostile names; the
// RabbitMQ adapter refuses queue names AMQP cannot carry.
func TestHostileNamesRefusedAtStartUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	for _, name := range hostileNames {
		if name == "" {
			continue // an empty parameter means the default table
		}
		q := "table=" + urlQueryEscape(name)
		for _, u := range []string{
			"sqlite://" + filepath.Join(dir, "n.db") + "?" + q,
			// Unreachable hosts: the name must be refused before any dial.
			"postgres://u:p@127.0.0.1:1/db?connect_timeout=1&" + q,
			"mysql://u:p@127.0.0.1:1/db?timeout=1s&" + q,
		} {
			var err error
			if strings.HasPrefix(u, "postgres") {
				_, err = core.OpenStore[pgx.Tx](ctx, u)
			} else {
				_, err = core.OpenStore[*sql.Tx](ctx, u)
			}
			if err == nil || !strings.Contains(err.Error(), "WithTable") {
				t.Errorf("%s: %v; want an error naming WithTable", strings.SplitN(u, ":", 2)[0], err)
			}
			if err != nil && (strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "dial tcp")) {
				t.Errorf("table %q: a connection was tried before the name was refused: %v", name, err)
			}
		}
	}
	b, _ := memory.NewBroker()
	defer b.Close()
	sub, _ := b.Subscribe("q")
	for _, name := range []string{"", "c\x00", "c\xff", strings.Repeat("c", 201)} {
		if _, err := core.New[any](sub, nopStore{}, func(context.Context, any, *core.Message) error { return nil }, core.WithName(name)); err == nil || !strings.Contains(err.Error(), "WithName") {
			t.Errorf("consumer name %q: %v; want an error naming WithName", name, err)
		}
	}
	for _, name := range []string{"", strings.Repeat("q", 256)} {
		if _, err := rabbitmq.Open(ctx, "amqp://u:p@127.0.0.1:1/", rabbitmq.WithQueue(name)); err == nil || !strings.Contains(err.Error(), "queue") {
			t.Errorf("queue name of %d bytes: %v; want an error naming the queue", len(name), err)
		}
	}
}

func urlQueryEscape(s string) string {
	r := strings.NewReplacer("%", "%25", "&", "%26", "#", "%23", " ", "%20", "+", "%2B", ";", "%3B", "\x00", "%00", "\xff", "%FF", "=", "%3D", "`", "%60", `"`, "%22")
	return r.Replace(s)
}

type nopStore struct{}

func (nopStore) Begin(context.Context) (driver.Txn[any], error) { return nil, nil }
func (nopStore) Close() error                                   { return nil }
func (nopStore) As(any) bool                                    { return false }
