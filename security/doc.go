// Package security holds no code of its own: its tests check, across
// brokers, stores and middleware together, that secrets in connection URLs
// never reach logs, errors or spans, and that hostile messages end with a
// clear decision at bounded cost. It is a package so that `go test ./...`
// runs them with everything else.
package security
