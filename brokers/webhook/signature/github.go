package signature

import (
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver/option"
)

const githubName = "github"

// The headers of a GitHub webhook delivery.
const (
	// HeaderGitHubSignature carries "sha256=<hex HMAC-SHA256 of the body>".
	HeaderGitHubSignature = "X-Hub-Signature-256"
	// HeaderGitHubDelivery carries the delivery's GUID, the event id; it is
	// not signed.
	HeaderGitHubDelivery = "X-GitHub-Delivery"
)

type github struct{ keys [][]byte }

// GitHub returns the profile of GitHub's webhook deliveries: the
// X-Hub-Signature-256 header holds the HMAC-SHA256 of the body under the
// webhook's secret, used as it is. The event id is X-GitHub-Delivery.
// GitHub sends no timestamp, so there is no tolerance and WithTolerance is
// refused; the legacy SHA-1 X-Hub-Signature is not accepted.
func GitHub(secrets []string, opts ...Option) (Profile, error) {
	c, err := newConfig(githubName, secrets, opts)
	if err != nil {
		return nil, err
	}
	if c.toleranceSet {
		return nil, option.Errorf("signature", "WithTolerance", "GitHub sends no timestamp to check")
	}
	return &github{keys: rawKeys(secrets)}, nil
}

func (*github) Name() string { return githubName }

func (p *github) Verify(h http.Header, body []byte, _ time.Time) (Event, error) {
	header := h.Get(HeaderGitHubSignature)
	if header == "" {
		return Event{}, fail(ErrNoSignature, githubName, HeaderGitHubSignature, "missing")
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return Event{}, fail(ErrMalformed, githubName, HeaderGitHubSignature, "not sha256=<hex>")
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil {
		return Event{}, fail(ErrMalformed, githubName, HeaderGitHubSignature, "not sha256=<hex>")
	}
	if !anyEqual(macs(p.keys, body), [][]byte{sig}) {
		return Event{}, fail(ErrBadSignature, githubName, HeaderGitHubSignature, "does not verify")
	}
	id := h.Get(HeaderGitHubDelivery)
	if id == "" {
		return Event{}, fail(ErrNoID, githubName, HeaderGitHubDelivery, "missing")
	}
	return Event{ID: id}, nil
}
