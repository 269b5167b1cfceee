// Package hostlist reads a URL that names the nodes of a cluster in place
// of one host, scheme://user:pass@h1:5672,h2:5672,[::1]:5673/path?query,
// and dials them in turn: the first dial from a node picked at random (so
// that many clients spread over the cluster), each failure on to the next
// node at once, every later dial from the node after the one reached last
// (it may be the one that went down). A client that takes one host per URL
// (amqp091-go, a database driver) gets one URL per node. An adapter
// written outside this module uses it as the adapters of this one do.
package hostlist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemq/idemq/internal/redact"
)

// List is a URL split into its nodes: each node's host[:port] and URL (the
// URL's scheme, user information, path, query and fragment around that
// node's host[:port]).
type List struct{ Hosts, URLs []string }

// Split splits the comma-separated host list of rawURL into one URL per
// node. A URL naming one host is left whole for its client to check (its
// one Host is set when net/url parses it). A bad entry of a list is an
// error naming its place; the entry is shown unless it may be part of the
// password (the user information is never shown).
func Split(rawURL string) (List, error) {
	single := List{URLs: []string{rawURL}}
	i := strings.Index(rawURL, "://")
	if i < 0 {
		return single, nil
	}
	start := i + len("://")
	end := len(rawURL)
	if j := strings.IndexAny(rawURL[start:], "/?#"); j >= 0 {
		end = start + j
	}
	hostStart := start + strings.LastIndex(rawURL[start:end], "@") + 1
	if !strings.Contains(rawURL[hostStart:end], ",") {
		if u, err := url.Parse(rawURL); err == nil {
			single.Hosts = []string{u.Host}
		}
		return single, nil
	}
	hosts := strings.Split(rawURL[hostStart:end], ",")
	l := List{Hosts: hosts, URLs: make([]string, len(hosts))}
	shown := redact.URL(rawURL)
	for k, h := range hosts {
		if err := CheckHostPort(h); err != nil {
			if !strings.Contains(shown, h) {
				// A password with a raw '/' or ',' put this entry here: the
				// text may be part of it.
				err = errors.New("not a host:port (not shown: it may hold a password)")
			}
			return List{}, fmt.Errorf("url host list: node %d of %d: %w", k+1, len(hosts), err)
		}
		l.URLs[k] = rawURL[:hostStart] + h + rawURL[end:]
	}
	return l, nil
}

// CheckHostPort checks one entry of a URL's host list: a host name or IP
// address (IPv6 in brackets), optionally with a numeric port.
func CheckHostPort(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	host, port := h, ""
	if strings.HasPrefix(h, "[") {
		k := strings.Index(h, "]")
		if k < 0 {
			return fmt.Errorf("%q: no ']' after the IPv6 address", h)
		}
		host, port = h[:k+1], strings.TrimPrefix(h[k+1:], ":")
		if rest := h[k+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
			return fmt.Errorf("%q: %q after the IPv6 address", h, rest)
		}
	} else if k := strings.LastIndex(h, ":"); k >= 0 {
		host, port = h[:k], h[k+1:]
	}
	if host == "" || host == "[]" {
		return fmt.Errorf("%q: empty host", h)
	}
	if strings.ContainsAny(host, ":@ ") && !strings.HasPrefix(host, "[") {
		return fmt.Errorf("%q: not a host:port", h)
	}
	if port != "" || strings.HasSuffix(h, ":") {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("%q: port %q is not a number in 1..65535", h, port)
		}
	}
	return nil
}

// Host returns node i's host[:port] for logs and errors, or "#i+1" for the
// one node of a URL net/url could not read.
func (l List) Host(i int) string {
	if i < len(l.Hosts) {
		return l.Hosts[i]
	}
	return "#" + strconv.Itoa(i+1)
}

// Dialer dials the nodes of a List, each once in turn from the node after
// the one it reached last. It is not safe for concurrent use: one
// connection's owner dials with it, one dial at a time.
type Dialer[C any] struct {
	list List
	next int
	dial func(ctx context.Context, url string) (C, error)
}

// NewDialer returns a Dialer over l's nodes that dials a node's URL with
// dial, starting at a node picked at random.
func NewDialer[C any](l List, dial func(ctx context.Context, url string) (C, error)) *Dialer[C] {
	return &Dialer[C]{list: l, next: rand.IntN(len(l.URLs)), dial: dial}
}

// Dial returns the first connection made, trying each node once. When
// every node failed (or ctx ended) the error joins each node's, its URL's
// secrets hidden, named by node where there are several.
func (d *Dialer[C]) Dial(ctx context.Context) (C, error) {
	n := len(d.list.URLs)
	var errs []error
	for k := range n {
		i := (d.next + k) % n
		c, err := d.dial(ctx, d.list.URLs[i])
		if err == nil {
			d.next = (i + 1) % n
			return c, nil
		}
		if msg := redact.Error(err, d.list.URLs[i]); msg != err.Error() {
			err = errors.New(msg)
		}
		if n > 1 {
			err = fmt.Errorf("node %s: %w", d.list.Host(i), err)
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	var zero C
	return zero, errors.Join(errs...)
}

// Last returns the host[:port] of the node the last successful Dial
// reached, for logs.
func (d *Dialer[C]) Last() string {
	n := len(d.list.URLs)
	return d.list.Host((d.next + n - 1) % n)
}

// Await runs dial, a dial that takes no context, so that ctx can abandon
// it: it returns ctx's error when ctx ends first, and a connection that
// arrives after that is released with release.
func Await[C any](ctx context.Context, dial func() (C, error), release func(C)) (C, error) {
	type result struct {
		c   C
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil {
				release(r.c)
			}
		}()
		var zero C
		return zero, ctx.Err()
	}
}
