package mysql

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net/url"

	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

// tlsParams are the mysql:// URL parameters that build a verifying TLS
// config without code, named as the mysql client's options.
var tlsParams = []string{"ssl-ca", "ssl-cert", "ssl-key", "ssl-server-name"}

// tlsFromURL builds the TLS config that u's ssl-ca, ssl-cert, ssl-key and
// ssl-server-name parameters ask for (nil when none is given) and returns
// the query without them, for the driver. ssl-ca turns TLS on with the
// server's certificate verified against that CA file and its name against
// ssl-server-name (default: the URL's host); ssl-cert and ssl-key add a
// client certificate.
func tlsFromURL(u *url.URL) (*tls.Config, string, error) {
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, "", fmt.Errorf("mysql URL parameters: %w", err)
	}
	given := map[string]string{}
	for _, k := range tlsParams {
		if q.Has(k) {
			given[k] = q.Get(k)
			q.Del(k)
		}
	}
	if len(given) == 0 {
		return nil, u.RawQuery, nil
	}
	ca, ok := given["ssl-ca"]
	if !ok {
		return nil, "", fmt.Errorf("mysql URL parameter ssl-ca: required with ssl-cert, ssl-key or ssl-server-name")
	} else if ca == "" {
		return nil, "", fmt.Errorf("mysql URL parameter ssl-ca: no file named")
	}
	if tv := q.Get("tls"); tv == "skip-verify" || tv == "preferred" || tv == "false" {
		return nil, "", fmt.Errorf("mysql URL parameter tls=%s: contradicts ssl-ca, which verifies the server", tv)
	}
	q.Del("tls")
	cfg, err := urlparam.TLSConfig("mysql", cmp.Or(given["ssl-server-name"], u.Hostname()), urlparam.File{Param: "ssl-ca", Path: ca},
		urlparam.File{Param: "ssl-cert", Path: given["ssl-cert"]}, urlparam.File{Param: "ssl-key", Path: given["ssl-key"]})
	if err != nil {
		return nil, "", err
	}
	return cfg, q.Encode(), nil
}
