package console_test

import (
	"context"
	"log"
	"log/slog"
	"net/http"
	"os"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
)

// The console mounted under /idemq/ of a service's admin server, behind the
// service's own authentication; the actions are logged with the user the
// middleware let in.
func Example() {
	ctx := context.Background()
	store, err := admin.OpenStore(ctx, os.Getenv("STORE_URL")) // postgres://…
	if err != nil {
		log.Fatal(err)
	}
	source := os.Getenv("SOURCE_URL") // amqp://…?queue=payments
	dlq, err := admin.OpenDeadLetters(ctx, source)
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{
		Store:     store,
		Consumers: []console.Consumer{{Name: "payments", DeadLetters: dlq, SourceURL: source}},
		Logger:    slog.Default(),
		User:      func(r *http.Request) string { return r.Header.Get("X-Authenticated-User") },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/idemq/", http.StripPrefix("/idemq", requireOperator(h)))
	log.Fatal(http.ListenAndServe("127.0.0.1:9090", mux))
}

// requireOperator is the service's authentication: it lets in operators
// only and says who they are.
func requireOperator(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if !ok || user != "ops" || pass != os.Getenv("OPS_PASSWORD") {
			w.Header().Set("WWW-Authenticate", `Basic realm="operators"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		r.Header.Set("X-Authenticated-User", user)
		next.ServeHTTP(w, r)
	})
}
