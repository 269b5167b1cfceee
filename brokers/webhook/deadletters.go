package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterDeadLetters("webhook", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.DeadLetters, error) {
		return OpenDeadLetters(ctx, u.String())
	})
}

// DeadLetters is an operator's handle on a Source's park directory, a
// driver.DeadLetters for idemq dlq and the console: Scan lists the parked
// requests oldest first, each with its file name as Ref, its request path
// as Origin and Destination, and its headers with names in lower case
// (several values joined by ", "); Purge deletes their files. It is no
// driver.Redriver, so admin.Redrive fails with admin.ErrNoRedrive: a
// parked request's signature is bound to the provider's secret and, for
// most providers, to the time it was sent, so only the provider can send
// a copy that verifies. Ask it to send the event again (its dashboard or
// API resends it), then purge the parked copy.
type DeadLetters struct {
	driver.DeadLetters // a deadletter.Queue over the directory, its Redrive left out
}

// OpenDeadLetters opens the park directory of the Source rawURL describes
// (the URL the Source is opened with; only park_dir is used, the other
// parameters are checked and ignored).
func OpenDeadLetters(_ context.Context, rawURL string) (*DeadLetters, error) {
	u, err := redact.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("webhook URL parameters: %w", err)
	}
	if _, err := params(&verifyParams{set: map[string]bool{}}).Read(q); err != nil {
		return nil, err
	}
	dir := q.Get("park_dir")
	if dir == "" {
		return nil, errors.New("webhook URL parameter park_dir: required: the directory parked requests are written to")
	}
	if err := checkDir(dir); err != nil {
		return nil, fmt.Errorf("webhook URL parameter park_dir: %w", err)
	}
	return &DeadLetters{deadletter.New[string](parkDir(dir))}, nil
}

// parkDir is a park directory as a deadletter.Store; a ref is a file name.
type parkDir string

func (d parkDir) Name() string { return string(d) }

func (d parkDir) Close() error { return nil }

// Each reads the parked files in name order, which is the order they were
// parked in.
func (d parkDir) Each(ctx context.Context, fn func(ref string, p *driver.Parked) error) error {
	names, err := filepath.Glob(filepath.Join(string(d), "*.json"))
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, path := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		pr, err := ReadParked(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // purged meanwhile
		}
		if err != nil {
			return err
		}
		ref := filepath.Base(path)
		h := make(map[string]string, len(pr.Headers))
		for k, v := range pr.Headers {
			h[strings.ToLower(k)] = strings.Join(v, ", ")
		}
		p := &driver.Parked{Ref: ref, ID: pr.ID, Cause: pr.Cause, Attempt: pr.Attempt, Origin: pr.Path, Destination: pr.Path,
			ParkedAt: pr.ParkedAt, Headers: h, Body: pr.Body}
		if err := fn(ref, p); err != nil {
			return err
		}
	}
	return nil
}

// Republish is never called: DeadLetters leaves Redrive out.
func (d parkDir) Republish(context.Context, string, *driver.Parked) error {
	return errors.New("webhook: a parked request cannot be redriven: ask the provider to send the event again")
}

// Remove deletes a parked file.
func (d parkDir) Remove(_ context.Context, ref string) error {
	if ref != filepath.Base(ref) || !strings.HasSuffix(ref, ".json") {
		return fmt.Errorf("webhook: %q is not a parked file's name", ref)
	}
	return os.Remove(filepath.Join(string(d), ref))
}
