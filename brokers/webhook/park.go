package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
)

// ParkedRequest is one parked request as its file holds it, in JSON: a
// request the Consumer dead-lettered, or a verified request that carries no
// event id. Each is written to its own file in the park directory, named
// after the time it was parked and a random suffix
// (20260102T150405.000000000Z-1a2b3c4d5e6f7a8b.json, so names sort by
// time), with mode 0600: the file is written under a temporary name,
// synced, then renamed, so a file of that name is always complete.
type ParkedRequest struct {
	// Version is the format's version, 1.
	Version int `json:"version"`
	// ID is the event id, "" when the request carried none.
	ID string `json:"id"`
	// Cause is why the request was parked, on one line.
	Cause string `json:"cause"`
	// Attempt is the delivery attempt it was parked at (1 for a request
	// parked without reaching the Consumer).
	Attempt int `json:"attempt"`
	// Profile is the signature profile that verified it.
	Profile string `json:"profile"`
	// Method is the request's method.
	Method string `json:"method"`
	// Path is the request's URL path.
	Path string `json:"path"`
	// RemoteAddr is the address the request came from, as the server saw
	// it (a proxy's, behind one).
	RemoteAddr string `json:"remote_addr"`
	// ReceivedAt is when the request arrived.
	ReceivedAt time.Time `json:"received_at"`
	// ParkedAt is when it was parked.
	ParkedAt time.Time `json:"parked_at"`
	// Headers are the request's headers, every value of each, names in
	// net/http's canonical form; the signature headers included, so the
	// request can be verified again.
	Headers http.Header `json:"headers"`
	// Body is the raw body, base64 in the file (standard encoding, padded).
	Body []byte `json:"body"`
}

// ReadParked reads the parked request in the file at path.
func ReadParked(path string) (*ParkedRequest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p ParkedRequest
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("webhook: parked request %s: %w", filepath.Base(path), err)
	}
	return &p, nil
}

// park writes q to a new file in the park directory with cause, and
// syncs the file and its directory entry: 200 once it is written, 503 (the
// sender sends it again) with the write's error when it could not be.
func (s *Source) park(q *request, cause string) (outcome, error) {
	p := &ParkedRequest{Version: 1, ID: q.id, Cause: deadletter.Cause(errors.New(cause)), Attempt: max(q.m.Attempt, 1), Profile: q.profile,
		Method: q.method, Path: q.path, RemoteAddr: q.remote, ReceivedAt: q.m.ReceivedAt, ParkedAt: s.c.now(), Headers: q.header, Body: q.m.Body}
	var r [8]byte
	_, _ = rand.Read(r[:])
	path := filepath.Join(s.c.parkDir, p.ParkedAt.UTC().Format("20060102T150405.000000000Z")+"-"+hex.EncodeToString(r[:])+".json")
	b, err := json.MarshalIndent(p, "", "  ")
	var tmp *os.File
	if err == nil {
		tmp, err = os.CreateTemp(s.c.parkDir, ".parking-*")
	}
	if err == nil {
		_, err = tmp.Write(append(b, '\n'))
		if err == nil {
			err = tmp.Sync()
		}
		if err = errors.Join(err, tmp.Close()); err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err == nil {
		if d, derr := os.Open(s.c.parkDir); derr == nil {
			if err = errors.Join(d.Sync(), d.Close()); err != nil {
				err = fmt.Errorf("syncing the directory: %w", err)
			}
		}
	}
	if err != nil {
		err = fmt.Errorf("webhook: parking a request in %s: %w", s.c.parkDir, err)
		s.log().Error("idemq webhook: parking a request failed; answering 503 so that the sender retries", "id", p.ID, "error", err)
		return outcome{status: http.StatusServiceUnavailable, retryAfter: s.c.wait, text: "could not park the request", handled: true}, err
	}
	s.log().Warn("idemq webhook: request parked", "id", p.ID, "file", path, "cause", p.Cause)
	return outcome{status: http.StatusOK, text: "parked", handled: true}, nil
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
	_, q, _, err := readURL(rawURL)
	if err != nil {
		return nil, err
	}
	if err := params.Explain(checkDir(q.Get("park_dir"))); err != nil {
		return nil, err
	}
	return &DeadLetters{deadletter.New[string](parkDir(q.Get("park_dir")))}, nil
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
		} else if err != nil {
			return err
		}
		h := make(map[string]string, len(pr.Headers))
		for k, v := range pr.Headers {
			h[strings.ToLower(k)] = strings.Join(v, ", ")
		}
		ref := filepath.Base(path)
		if err := fn(ref, &driver.Parked{Ref: ref, ID: pr.ID, Cause: pr.Cause, Attempt: pr.Attempt, Origin: pr.Path,
			Destination: pr.Path, ParkedAt: pr.ParkedAt, Headers: h, Body: pr.Body}); err != nil {
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
