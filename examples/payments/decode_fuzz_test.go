package main

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemq/idemq/core"
)

// FuzzDecodePayment: any body either decodes into a payment the stores can
// take, or is refused with a permanent error (dead-lettered at once, never
// retried); it never panics.
func FuzzDecodePayment(f *testing.F) {
	for _, s := range []string{
		`{"account": "acc-17", "amount_cents": 1250}`, `{"account": "", "amount_cents": 1}`,
		`{"account": "a\u0000b", "amount_cents": 1}`, `{"account": "a", "amount_cents": 9223372036854775807}`,
		`{"account": "a", "amount_cents": 0}`, `not json`, `{"account": "\xff", "amount_cents": 5}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := decode(body)
		if err != nil {
			if !core.IsPermanent(err) {
				t.Fatalf("decode(%q) = %v, a transient error: the message would be retried for nothing", body, err)
			}
			return
		}
		if p.Account == "" || len(p.Account) > 255 || !utf8.ValidString(p.Account) || strings.ContainsRune(p.Account, 0) {
			t.Fatalf("decode(%q) accepted account %q", body, p.Account)
		}
		if p.AmountCents == 0 || p.AmountCents > maxAmountCents || p.AmountCents < -maxAmountCents {
			t.Fatalf("decode(%q) accepted amount %d", body, p.AmountCents)
		}
	})
}
