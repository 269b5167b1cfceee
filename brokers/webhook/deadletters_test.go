package webhook

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/core/driver"
)

// The park directory reads as a dead-letter queue: listed, refused for a
// redrive, purged.
func TestDeadLetters(t *testing.T) {
	r := newRig(t, func(m *core.Message) error { return core.Permanent(errors.New("refused: " + m.ID)) }, nil)
	mustStatus(t, send(githubRequest(t, r.url, "d-a", "first")), http.StatusOK)
	mustStatus(t, send(githubRequest(t, r.url, "", "no id")), http.StatusOK)
	mustStatus(t, send(githubRequest(t, r.url, "d-b", "second")), http.StatusOK)

	ctx := context.Background()
	q, err := admin.OpenDeadLetters(ctx, "webhook://127.0.0.1:0/hooks/github?verify=github&secret_env=UNUSED&park_dir="+r.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var got []*admin.Parked
	if err := q.Scan(ctx, func(p *admin.Parked) error { got = append(got, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ID != "d-a" || got[1].ID != "" || got[2].ID != "d-b" {
		t.Fatalf("scanned %d: %+v", len(got), got)
	}
	if p := got[0]; !strings.Contains(p.Cause, "refused: d-a") || p.Attempt != 1 || p.Origin != "/hooks/github" || string(p.Body) != "first" ||
		p.Headers["x-github-delivery"] != "d-a" || p.ParkedAt.IsZero() || !strings.HasSuffix(p.Ref, ".json") {
		t.Errorf("parked %+v", p)
	}
	if _, ok := q.(driver.Redriver); ok {
		t.Error("the park directory is a driver.Redriver")
	}
	if n, err := admin.Redrive(ctx, q, nil, nil); n != 0 || !errors.Is(err, admin.ErrNoRedrive) {
		t.Errorf("Redrive = %d, %v; want 0 and admin.ErrNoRedrive", n, err)
	}
	if n, err := q.Purge(ctx, func(p *admin.Parked) bool { return p.ID != "" }); n != 2 || err != nil {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if ps := parkedFiles(t, r.dir); len(ps) != 1 || ps[0].ID != "" {
		t.Errorf("left %+v, want the one without an id", ps)
	}
	for raw, want := range map[string]string{
		"webhook://h:1/x?verify=github":                   "park_dir: required",
		"webhook://h:1/x?park_dir=/nonexistent/x":         "park_dir: stat",
		"webhook://h:1/x?park_dir=" + r.dir + "&pakr_dr=": "unknown parameter",
	} {
		if _, err := OpenDeadLetters(ctx, raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}
