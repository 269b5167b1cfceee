package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/admin/console"
	"github.com/idemq/idemq/internal/cli"
	"github.com/idemq/idemq/internal/redact"
)

const consoleUsage = `Usage: idemq console --store URL --broker CONSUMER=URL… [flags]

Serves the operator's console in the browser (package admin/console): per
consumer the claims, dead letters waiting and the retention check; dead
letters grouped by cause, redriven or purged after a confirmation; the
lookup and forgetting of message ids; the outbox's backlog and parked rows.

--broker names a consumer (its idemq name) and its source URL, as idemq dlq
takes it (repeatable); --consumer names a consumer without a broker to read
dead letters from. --outbox TABLE shows the outbox table of the store.

The console asks for HTTP basic authentication: the user name and password
come from IDEMQ_CONSOLE_USER and IDEMQ_CONSOLE_PASSWORD, never from the
command line. Without them it serves only on a loopback address, and says
so, and answers only requests addressed to a loopback name (localhost,
127.0.0.1, [::1]), so that a web page whose DNS name is pointed at
127.0.0.1 cannot read it. Its actions then work for anyone who reaches
it, but never from a page of another origin. --read-only refuses every
action. Every action is logged to standard error: who, what, how many.
`

// consoleEnv names the variables that hold the console's credentials.
const (
	consoleUserEnv     = "IDEMQ_CONSOLE_USER"
	consolePasswordEnv = "IDEMQ_CONSOLE_PASSWORD"
)

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("idemq console", consoleUsage, stdout)
	storeURL := f.StoreFlag()
	var rawBrokers, names []string
	// Collected raw and checked after parsing: the flag package's own
	// errors quote the value, which may hold a password.
	f.Func("broker", "CONSUMER=URL: a consumer and its source URL (repeatable)", func(v string) error {
		rawBrokers = append(rawBrokers, v)
		return nil
	})
	f.Func("consumer", "a consumer without a broker URL (repeatable)", func(v string) error {
		names = append(names, v)
		return nil
	})
	listen := f.String("listen", "127.0.0.1:8089", "host:port to serve on")
	outbox := f.String("outbox", "", "the store's outbox `TABLE` to show (default: none)")
	readOnly := f.Bool("read-only", false, "refuse every action")
	raw, err := parseStore(f, storeURL, args)
	if err != nil {
		return err
	}
	user, pass := os.Getenv(consoleUserEnv), os.Getenv(consolePasswordEnv)
	if (user == "") != (pass == "") {
		return cli.Usagef("set both %s and %s, or neither", consoleUserEnv, consolePasswordEnv)
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return cli.Usagef("--listen %q: want host:port", *listen)
	}
	if ip := net.ParseIP(host); user == "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return cli.Usagef("--listen %s is not a loopback address: set %s and %s so the console asks for a password", *listen, consoleUserEnv, consolePasswordEnv)
	}
	var consumers []console.Consumer
	for _, v := range rawBrokers {
		b, ok := parseBrokerArg(v)
		if !ok || b.consumer == "" {
			return cli.Usagef("--broker %s: want CONSUMER=URL", redact.URL(v))
		}
		if err := brokerHint(b.url); err != nil {
			return err
		}
		dl, err := admin.OpenDeadLetters(ctx, b.url)
		if err != nil {
			return hideSecrets(err, b.url)
		}
		defer dl.Close()
		consumers = append(consumers, console.Consumer{Name: b.consumer, DeadLetters: dl, SourceURL: b.url})
	}
	for _, n := range names {
		consumers = append(consumers, console.Consumer{Name: n})
	}
	return withStore(ctx, raw, func(s *admin.Store) error {
		cfg := console.Config{Store: s, Consumers: consumers, ReadOnly: *readOnly,
			Logger: slog.New(slog.NewTextHandler(stderr, nil))}
		if *outbox != "" {
			ob, err := admin.OpenOutbox(ctx, raw, *outbox)
			if err != nil {
				return hideSecrets(err, raw)
			}
			defer ob.Close()
			cfg.Outbox = ob
		}
		h, err := console.New(cfg)
		if err != nil {
			return cli.Usagef("%v", err)
		}
		if user != "" {
			h = basicAuth(h, user, pass)
		} else {
			h = loopbackHosts(h)
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		auth := "basic authentication from " + consoleUserEnv
		if user == "" {
			auth = "no authentication (loopback only; set " + consoleUserEnv + " and " + consolePasswordEnv + ")"
		}
		fmt.Fprintf(stdout, "idemq console: serving http://%s/ (%s)\n", ln.Addr(), auth)
		go func() {
			<-ctx.Done()
			shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shut)
		}()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// basicAuth asks for user and pass before next, comparing in constant
// time.
func basicAuth(next http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="idemq console", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackHosts answers only requests whose Host is a loopback address or
// localhost, 421 Misdirected Request otherwise. A console without a
// password trusts whoever reaches it; a page whose DNS name an attacker
// points at 127.0.0.1 (DNS rebinding) would reach it under its own name,
// be of the same origin to the browser, read its pages and pass its
// origin check.
func loopbackHosts(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
		if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || strings.EqualFold(host, "localhost") {
			next.ServeHTTP(w, r)
			return
		}
		http.Error(w, "idemq console: without a password it answers only requests to a loopback address or localhost", http.StatusMisdirectedRequest)
	})
}
