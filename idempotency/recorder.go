package idempotency

import (
	"bytes"
	"net/http"
)

// recorder is the ResponseWriter a handler writes to: it keeps the whole
// response, which is sent only once its transaction has committed.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: make(http.Header)} }

// Header returns the headers the response will carry.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the status; only the first call counts, as with
// net/http.
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// Write appends to the body, the status defaulting to 200.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// result is the response to store: the status, the headers of names, and
// the body.
func (r *recorder) result(names []string) stored {
	s := stored{status: r.status, header: make(http.Header, len(names)), body: r.body.Bytes()}
	if s.status == 0 {
		s.status = http.StatusOK
	}
	for _, n := range names {
		if v, ok := r.header[n]; ok {
			s.header[n] = v
		}
	}
	return s
}

// send writes a response to w: header's fields, the status and the body.
func send(w http.ResponseWriter, header http.Header, status int, body []byte) {
	h := w.Header()
	for k, v := range header {
		h[k] = v
	}
	w.WriteHeader(status)
	w.Write(body)
}
