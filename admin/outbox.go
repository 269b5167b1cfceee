package admin

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/registry"
	"github.com/idemq/idemq/outbox"
)

// OutboxTable is an outbox table opened for operations: its parked rows
// and backlog (outbox.Operator), its name, and Close, which releases the
// connections the opener made.
type OutboxTable interface {
	outbox.Operator
	Table() string
	Close() error
}

// OutboxOpener opens the outbox table named table ("" for the outbox
// package's default) in the database u points at; u carries no table
// parameter.
type OutboxOpener func(ctx context.Context, u *url.URL, table string) (OutboxTable, error)

var outboxes = &registry.Openers[OutboxOpener]{Kind: "outbox"}

// RegisterOutbox makes an outbox package's tables available to OpenOutbox
// under a URL scheme. The outbox packages call it from init. It panics if
// the scheme is registered twice or open is nil.
func RegisterOutbox(scheme string, open OutboxOpener) {
	if open == nil {
		panic("idemq: RegisterOutbox " + scheme + ": nil opener")
	}
	outboxes.Register("RegisterOutbox", scheme, open)
}

// ErrBadURL is wrapped by the errors of a URL an opener cannot take: an
// unknown scheme or parameter, or parameters that contradict each other.
var ErrBadURL = errors.New("bad URL")

// OpenOutbox opens an outbox table for operations: rawURL is its
// database (postgres://, mysql://, sqlite://path with the outbox packages
// imported), and the table is the URL's ?table= or table, else the outbox
// package's default. Errors never contain credentials.
func OpenOutbox(ctx context.Context, rawURL, table string) (OutboxTable, error) {
	u, err := redact.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idemq: %w: %v", ErrBadURL, err)
	}
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("idemq: %w: parameters: %v", ErrBadURL, err)
	}
	if t := q.Get("table"); t != "" {
		if table != "" && table != t {
			return nil, fmt.Errorf("idemq: %w: the table %s and the URL's ?table=%s differ", ErrBadURL, table, t)
		}
		table = t
	}
	q.Del("table")
	rest := *u
	rest.RawQuery = q.Encode()
	scheme := strings.ToLower(u.Scheme)
	open, ok := outboxes.Get(scheme)
	if !ok {
		return nil, fmt.Errorf("idemq: %w: %s: no outbox registered for %s:// (registered: %s)", ErrBadURL, redact.URL(rawURL), scheme, strings.Join(outboxes.Schemes(), ", "))
	}
	t, err := open(ctx, &rest, table)
	switch {
	case errors.Is(err, ErrBadURL):
		// The opener's own words, without secrets, still an ErrBadURL.
		return nil, fmt.Errorf("idemq: %w: %s", ErrBadURL, strings.TrimPrefix(redact.Error(err, rawURL), ErrBadURL.Error()+": "))
	case err != nil:
		return nil, fmt.Errorf("idemq: opening outbox on %s: %s", redact.URL(rawURL), redact.Error(err, rawURL))
	}
	return t, nil
}
