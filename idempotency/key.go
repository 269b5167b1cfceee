package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLength is the longest key accepted, in bytes once unquoted.
const MaxKeyLength = 255

// HeaderKey is the request header that carries the key.
const HeaderKey = "Idempotency-Key"

// errKey is the error of every malformed key; its wrapped text says why.
var errKey = errors.New("malformed Idempotency-Key")

// parseKey reads an Idempotency-Key field value: an RFC 8941 sf-string
// ("abc", with \" and \\ as the only escapes and printable ASCII inside),
// or, for clients that send the key bare, a token-like value made of
// letters, digits and !#$%&'*+-.^_`|~:/=. Surrounding spaces and tabs are
// ignored; an empty key, parameters after the string, and keys longer than
// MaxKeyLength are refused.
func parseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", errKey)
	}
	if v[0] != '"' {
		for i := 0; i < len(v); i++ {
			if !bareChar(v[i]) {
				return "", fmt.Errorf("%w: character %q at %d is not allowed in an unquoted key (quote it as a structured-field string)", errKey, v[i], i)
			}
		}
		return checkLength(v)
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: a backslash escapes only \" and \\", errKey)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the closing quote", errKey)
			}
			if b.Len() == 0 {
				return "", fmt.Errorf("%w: empty", errKey)
			}
			return checkLength(b.String())
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at %d is not printable ASCII", errKey, c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: no closing quote", errKey)
}

func checkLength(k string) (string, error) {
	if len(k) > MaxKeyLength {
		return "", fmt.Errorf("%w: %d bytes, at most %d", errKey, len(k), MaxKeyLength)
	}
	return k, nil
}

// bareChar reports whether c may appear in an unquoted key: an RFC 9110
// tchar, or one of : / = (base64 and URN-like keys).
func bareChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/=", c) >= 0
}
