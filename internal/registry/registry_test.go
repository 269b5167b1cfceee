package registry

import (
	"net/url"
	"strings"
	"testing"
)

func TestLookupErrorsSayWhatToWrite(t *testing.T) {
	r := &Openers[int]{Kind: "store"}
	r.Register("test", "mysql", 1)
	r.Register("test", "postgres", 2)
	for raw, want := range map[string]string{
		"":                                       "the store URL is empty (registered schemes: mysql, postgres)",
		"  ":                                     "the store URL is empty",
		"root:s3cret@tcp(127.0.0.1:3306)/test":   "driver's DSN, not a URL: write mysql://root:PASSWORD@127.0.0.1:3306/test",
		"app@tcp(db:3306)/orders?parseTime=true": "write mysql://app:PASSWORD@db:3306/orders",
		"host=db port=5432 user=app password=s3cret dbname=orders": "write postgres://app:PASSWORD@db:5432/orders",
		"redis://h/0": `no store registered for scheme "redis" (registered: mysql, postgres)`,
	} {
		_, _, err := Open(r, raw, "store", func(int, *url.URL) (int, error) { return 0, nil })
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v, want %q without the password", raw, err, want)
		}
	}
}
