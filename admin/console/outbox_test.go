package console_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/outbox/sqliteoutbox"
)

// The outbox page on SQLite: backlog and parked rows; redrive of a ticked
// row, purge of the rest.
func TestOutboxSQLite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	o, err := sqliteoutbox.New(sqliteoutbox.WithTable("events_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Write(ctx, tx,
		&outbox.Message{ID: "P1", Key: "k1", Destination: "orders", Body: []byte("poison")},
		&outbox.Message{ID: "B", Key: "k1", Destination: "orders", Body: []byte("b")},
		&outbox.Message{ID: "P2", Destination: "emails", Body: []byte("poison!")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	pub := outbox.PublisherFunc(func(_ context.Context, dest string, msgs ...*driver.Message) error {
		for _, m := range msgs {
			if strings.HasPrefix(string(m.Body), "poison") {
				return fmt.Errorf("%s: message too large", dest)
			}
		}
		return nil
	})
	relay, err := outbox.NewRelay(o.Store(db), pub, outbox.WithMaxAttempts(1), outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	relay.RunOnce(ctx)
	table, err := admin.OpenOutbox(ctx, "sqlite://"+path+"?table=events_outbox", "")
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	parked, err := table.Parked(ctx, outbox.ParkedFilter{})
	if err != nil || len(parked) != 2 {
		t.Fatalf("parked %+v, %v; want P1 and P2", parked, err)
	}

	s, _ := openSQLite(t)
	logger, logs := newLogger()
	h, err := console.New(console.Config{Store: s, Outbox: table, Logger: logger, Consumers: []console.Consumer{{Name: "orders"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := mount(t, h)
	c.get("", "Outbox events_outbox", "Parked rows", "1 (1 pending rows behind parked rows)")
	c.get("outbox", "1 pending rows", "2 parked", "P1", "P2", "orders: message too large")
	c.get("outbox?cause=emails", "P2")
	if code, _ := c.do("GET", "outbox/confirm?do=redrive", nil, nil); code != 400 {
		t.Errorf("a redrive that chooses no row: %d, want 400", code)
	}

	_, action, form := c.confirm(fmt.Sprintf("outbox/confirm?do=redrive&seq=%d", parked[0].Seq), "<strong>1</strong> parked rows", "P1")
	c.post(action, form, "redrove 1 parked rows")
	_, action, form = c.confirm("outbox/confirm?do=purge-all", "<strong>1</strong> parked rows", "P2")
	bad := cloneForm(form)
	bad.Set("token", form.Get("token")+"x")
	if code, _ := c.do("POST", action, bad, nil); code != 403 {
		t.Errorf("purge with a wrong token: %d, want 403", code)
	}
	c.post(action, form, "purged 1 parked rows")
	st, err := table.Stats(ctx)
	if err != nil || st.Parked != 0 || st.Pending != 2 {
		t.Errorf("stats %+v, %v; want nothing parked, P1 and B pending", st, err)
	}
	c.get("outbox?"+url.Values{"key": {"k1"}}.Encode(), "No parked rows match")
	l := logs.String()
	for _, want := range []string{`action="outbox redrive" table=events_outbox count=1`, `action="outbox purge" table=events_outbox count=1`} {
		if !strings.Contains(l, want) {
			t.Errorf("no %q in the log:\n%s", want, l)
		}
	}
}
