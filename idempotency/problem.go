package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem types of the answers the middleware writes itself (RFC 9457
// "type" members); docs/http.md lists them with their statuses.
const (
	problemBase       = "https://github.com/idemq/idemq/blob/main/docs/http.md#"
	problemMissing    = problemBase + "missing-key"
	problemMalformed  = problemBase + "malformed-key"
	problemInProgress = problemBase + "in-progress"
	problemMismatch   = problemBase + "key-reused"
	problemExpired    = problemBase + "response-expired"
	problemTooLarge   = problemBase + "body-too-large"
	problemFailed     = problemBase + "handler-failed"
	problemStore      = problemBase + "store-unavailable"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// writeProblem answers with an application/problem+json body; retryAfter
// above zero adds Retry-After, in seconds.
func writeProblem(w http.ResponseWriter, status int, typ, title, detail string, retryAfter int) {
	body, _ := json.Marshal(problem{Type: typ, Title: title, Status: status, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	w.Write(body)
}
