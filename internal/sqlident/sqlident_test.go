package sqlident

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, good := range []string{"a", "_", "processed_messages", "T1", strings.Repeat("x", MaxLength)} {
		if err := Check(good); err != nil {
			t.Errorf("Check(%q) = %v, want nil", good, err)
		}
	}
	for name, want := range map[string]string{
		"":                               "empty",
		strings.Repeat("x", MaxLength+1): "64 characters long, at most 63",
		"1abc":                           "starts with a digit",
		"a-b":                            `'-'`,
		"x; DROP TABLE y":                `';'`,
		"tåble":                          "'Ã'",
		"a.b":                            `'.'`,
	} {
		err := Check(name)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v, want an error with %q", name, err, want)
		}
	}
	if err := CheckMax(strings.Repeat("x", 59), 58); err == nil || !strings.Contains(err.Error(), "at most 58") {
		t.Errorf("CheckMax over the limit: %v", err)
	}
}

// TestCheckQuotesNoName keeps a secret that landed in a table name out of
// the error: only one character of it may show.
func TestCheckQuotesNoName(t *testing.T) {
	const secret = "hunter2pass"
	for _, name := range []string{secret + "!", "9" + secret, strings.Repeat(secret, 7)} {
		if err := Check(name); err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("Check error %v quotes the name", err)
		}
	}
}
