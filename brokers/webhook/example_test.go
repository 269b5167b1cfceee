package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/idemq/idemq/brokers/webhook"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// A service mounts the inbox in its own mux and runs a Consumer on it:
// GitHub's delivery is applied once, and both copies are answered 200, the
// first after its effect was committed.
func ExampleNewSource() {
	dir, _ := os.MkdirTemp("", "idemq-webhook")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	profile, err := signature.GitHub([]string{"It's a Secret to Everybody"})
	if err != nil {
		log.Fatal(err)
	}
	src, err := webhook.NewSource(webhook.WithProfile(profile), webhook.WithParkDir(dir))
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	store.DB().Exec(`CREATE TABLE pushes (delivery TEXT, payload TEXT)`)
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO pushes VALUES (?, ?)`, m.ID, m.Body)
		return err
	}, core.WithName("pushes"))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()

	mux := http.NewServeMux()
	mux.Handle("POST /hooks/github", src)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// GitHub sends the same delivery twice.
	body := []byte(`{"ref":"refs/heads/main"}`)
	m := hmac.New(sha256.New, []byte("It's a Secret to Everybody"))
	m.Write(body)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hooks/github", bytes.NewReader(body))
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	var n int
	store.DB().QueryRow(`SELECT count(*) FROM pushes`).Scan(&n)
	fmt.Println("pushes applied:", n)
	cancel()
	<-ran
	// Output:
	// 200 OK
	// 200 OK
	// pushes applied: 1
}

// A Consumer of Stripe events by URL: the inbox listens on 127.0.0.1:8080
// and serves /hooks/stripe; the secret file holds one signing secret a
// line (two during a rotation). Run's shutdown closes the server.
func ExampleOpen() {
	ctx := context.Background()
	src, err := core.OpenSource(ctx, "webhook://127.0.0.1:8080/hooks/stripe?verify=stripe&secret_file=/run/secrets/stripe&park_dir=/var/lib/payments/parked")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlite.Open(ctx, "payments.db")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err := core.New(src, store, func(ctx context.Context, tx *sql.Tx, m *core.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO stripe_events (id, payload) VALUES (?, ?)`, m.ID, m.Body)
		return err
	}, core.WithName("payments"))
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(c.Run(ctx))
}
