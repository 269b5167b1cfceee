package core

import (
	"crypto/sha256"
	"encoding/base64"
)

// Fingerprint returns the default body fingerprint: the first 128 bits of
// the body's SHA-256 in unpadded base64url (22 characters). Stores keep it
// beside the claim so that the same id arriving with a different body is
// caught instead of acknowledged. 128 bits make an accidental match of two
// different bodies of one id practically impossible while keeping claim
// rows and claim statements narrow.
func Fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}
