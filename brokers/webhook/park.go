package webhook

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"
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

// park writes p to a new file in dir and returns its path once the file
// and its directory entry are synced.
func park(dir string, p *ParkedRequest) (string, error) {
	p.Version = 1
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return "", err
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	name := p.ParkedAt.UTC().Format("20060102T150405.000000000Z") + "-" + hex.EncodeToString(r[:]) + ".json"
	tmp, err := os.CreateTemp(dir, ".parking-*")
	if err != nil {
		return "", fmt.Errorf("webhook: parking a request in %s: %w", dir, err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	if werr == nil {
		werr = tmp.Sync()
	}
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("webhook: parking a request in %s: %w", dir, err)
	}
	path := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("webhook: parking a request in %s: %w", dir, err)
	}
	if d, err := os.Open(dir); err == nil {
		err = errors.Join(d.Sync(), d.Close())
		if err != nil {
			return path, fmt.Errorf("webhook: parking a request in %s (syncing the directory): %w", dir, err)
		}
	}
	return path, nil
}
