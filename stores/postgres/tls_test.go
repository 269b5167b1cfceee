package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/tlstest"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
)

// TestTLSVerifyFull connects to a private PostgreSQL server with TLS on
// (and plaintext refused by pg_hba.conf) with sslmode=verify-full against
// a throw-away CA, runs a claim through the store, logs in with a client
// certificate, and shows that a wrong CA, a wrong server name, a missing
// client certificate and plaintext are refused with errors that say so.
func TestTLSVerifyFull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL server; not in -short")
	}
	f := tlstest.Certs(t, "postgres")
	port := tlstest.Postgres(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := func(host, ca, mode string) string {
		return fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=%s&sslrootcert=%s&table=tls_claims", host, port, mode, ca)
	}

	store, err := core.OpenStore[pgx.Tx](ctx, base("127.0.0.1", f.CA, "verify-full"))
	if err != nil {
		t.Fatalf("verify-full with the right CA: %v", err)
	}
	s := store.(*postgres.Store)
	defer s.Close()
	var ssl bool
	var version string
	if err := s.Pool().QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version); err != nil {
		t.Fatal(err)
	}
	if !ssl {
		t.Fatal("pg_stat_ssl says this connection is not encrypted")
	}
	t.Logf("connected with %s, server certificate verified (verify-full)", version)
	txn, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := txn.Claim(ctx, "tls", []driver.Claim{{ID: "m1"}})
	if err != nil || res[0] != driver.ClaimWon {
		t.Fatalf("claim over TLS: %v %v", res, err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// "localhost" is in the certificate too: verify-full accepts it.
	if s2, err := core.OpenStore[pgx.Tx](ctx, base("localhost", f.CA, "verify-full")); err != nil {
		t.Errorf("verify-full via localhost: %v", err)
	} else {
		s2.(*postgres.Store).Close()
	}

	// Client-certificate authentication: role idemq-client may log in
	// only with the certificate the test CA issued to that name.
	if _, err := s.Pool().Exec(ctx, `CREATE ROLE "idemq-client" LOGIN`); err != nil {
		t.Fatal(err)
	}
	certURL := fmt.Sprintf("postgres://idemq-client@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s&table=tls_claims&migrate=false",
		port, f.CA, f.ClientCert, f.ClientKey)
	if s3, err := core.OpenStore[pgx.Tx](ctx, certURL); err != nil {
		t.Errorf("client certificate login: %v", err)
	} else {
		s3.(*postgres.Store).Close()
	}

	refused := []struct {
		name, url string
		want      string // in the error
	}{
		{"wrong CA", base("127.0.0.1", f.OtherCA, "verify-full"), "certificate signed by unknown authority"},
		{"wrong CA with verify-ca", base("127.0.0.1", f.OtherCA, "verify-ca"), "certificate signed by unknown authority"},
		// pgx has no server-name override: a name that is not in the
		// certificate is shown by connecting through another loopback
		// address, which the private server listens on too.
		{"wrong server name", base("127.0.0.2", f.CA, "verify-full"), "certificate is valid for 127.0.0.1, ::1, not 127.0.0.2"},
		{"client certificate role without a certificate", fmt.Sprintf("postgres://idemq-client@127.0.0.1:%d/postgres?sslmode=verify-full&sslrootcert=%s", port, f.CA), "connection requires a valid client certificate"},
		{"plaintext", fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), "no encryption"},
	}
	for _, c := range refused {
		_, err := core.OpenStore[pgx.Tx](ctx, c.url)
		if err == nil {
			t.Errorf("%s: connected; want a refusal", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
			continue
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
}
