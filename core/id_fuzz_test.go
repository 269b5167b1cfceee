package core

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidateID: the id check accepts exactly the ids of valid UTF-8
// without NUL bytes, and shortID bounds what a hostile id puts in errors
// and logs.
func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"", "a", "a\x00b", "\xff", "'; DROP TABLE x; --", strings.Repeat("é", 200), "💳\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := validateIDBytes(id)
		valid := utf8.ValidString(id) && !strings.ContainsRune(id, 0)
		if (err == nil) != valid {
			t.Fatalf("validateIDBytes(%q) = %v; valid UTF-8 without NUL is %v", id, err, valid)
		}
		if s := shortID(id); len(s) > 128+40 {
			t.Fatalf("shortID gives %d bytes", len(s))
		}
		c := &Consumer[any]{cfg: defaultConfig()}
		if err := c.validateID(id); err == nil && (id == "" || len(id) > 255 || !valid) {
			t.Fatalf("validateID(%q) accepted", id)
		}
	})
}
