package idempotency_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/idempotency"
	"github.com/idemq/idemq/stores/postgres"
	"github.com/jackc/pgx/v5"
)

// An order API whose POST applies once per Idempotency-Key: the order row,
// the key's claim and the 201 response commit in one transaction, and a
// retry of the request gets that response again.
func ExampleNew() {
	ctx := context.Background()
	store, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	keys, err := idempotency.New(store,
		idempotency.WithName("orders-api"),
		// One client's key never meets another's.
		idempotency.WithScope(func(r *http.Request) string { return r.Header.Get("X-Account") + " " + r.Method + " " + r.URL.Path }))
	if err != nil {
		log.Fatal(err)
	}
	if err := keys.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// Keys expire with the store's retention (7 days by default, published
	// to clients): the store prunes the claims, this loop the responses.
	go store.RunPruner(ctx, time.Hour, 1000, nil)
	go func() {
		for range time.Tick(time.Hour) {
			if _, err := admin.Prune(ctx, keys, time.Now().Add(-store.Retention()), admin.PruneOptions{Batch: 1000}); err != nil {
				log.Print(err)
			}
		}
	}()

	mux := http.NewServeMux()
	mux.Handle("POST /orders", keys.Handler(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var in struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			w.WriteHeader(http.StatusBadRequest) // stored and replayed like any answer
			return nil
		}
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Item).Scan(&id); err != nil {
			return err // rolled back: 500, and the retry runs again
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		return json.NewEncoder(w).Encode(map[string]any{"id": id, "item": in.Item})
	}))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
