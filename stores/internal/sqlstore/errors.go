package sqlstore

import (
	"context"
	"errors"
	"io"
	"net"
)

// ConnLost reports the client-side errors of a lost connection that every
// store's IsTransient treats as worth a retry: EOF, an unexpected EOF, a
// context deadline, or a network error.
func ConnLost(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr)
}
