package security

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestCLIOutputHidesSecrets builds cmd/idemq and runs migrate, stats and
// prune with passwords in the store URL — against the test PostgreSQL
// (which may ignore the password under trust auth, so the commands
// succeed and print their results), an unreachable host, an unparseable
// URL and a password holding '@' and ':' — and checks that neither stdout
// nor stderr ever shows the password; --help shows none either.
func TestCLIOutputHidesSecrets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/idemq; not in -short")
	}
	pg := servicetest.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := filepath.Join(t.TempDir(), "idemq")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../cmd/idemq").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/idemq: %v\n%s", err, out)
	}
	secret := "cliS3cret-" + randHex(6)
	table := "idemq_cli_" + randHex(4)
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	withSecret := *u
	withSecret.User = url.UserPassword(user, secret) // trust auth ignores it; password auth refuses it
	q := withSecret.Query()
	q.Set("table", table)
	withSecret.RawQuery = q.Encode()
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.Background(), pg); err == nil {
			c.Exec(context.Background(), `DROP TABLE IF EXISTS `+table)
			c.Close(context.Background())
		}
	})
	stores := []string{
		withSecret.String(),
		fmt.Sprintf("postgres://app:%s@127.0.0.1:1/db", secret),
		fmt.Sprintf("postgres://app:%s@127.0.0.1:notaport/db", secret),
		fmt.Sprintf("postgres://app:p@ss:%s@127.0.0.1:1/db", secret),
		fmt.Sprintf("mysql://app:%s@127.0.0.1:1/db?timeout=1s", secret),
		fmt.Sprintf("sqlite://%s?token=%s", filepath.Join(t.TempDir(), "x.db"), secret),
	}
	runs, ok := 0, 0
	for _, store := range stores {
		for _, args := range [][]string{
			{"migrate", "--store", store},
			{"stats", "--store", store},
			{"stats", "--json", "--store", store},
			{"prune", "--store", store, "--older-than", "1h"},
		} {
			c := exec.CommandContext(ctx, bin, args...)
			out, err := c.CombinedOutput()
			runs++
			if err == nil {
				ok++
			}
			if strings.Contains(string(out), secret) {
				t.Errorf("idemq %s shows the password:\n%s", args[0], out)
			}
		}
	}
	out, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	if len(out) == 0 || strings.Contains(string(out), secret) {
		t.Errorf("--help: %q", out)
	}
	if ok == 0 {
		t.Error("no CLI run succeeded: the success paths (which print the store) were not checked")
	}
	t.Logf("%d CLI runs with a password in the store URL (%d succeeded, the rest failed as they should); none showed it", runs, ok)
}
