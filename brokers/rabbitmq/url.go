package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	for _, scheme := range []string{"amqp", "amqps"} {
		driver.RegisterBroker(scheme, openSourceURL, openPublisherURL)
		admin.RegisterDeadLetters(scheme, openDeadLettersURL)
	}
}

// amqpParams are the URI query parameters left to amqp091-go.
var amqpParams = map[string]bool{
	"heartbeat": true, "connection_timeout": true, "channel_max": true, "auth_mechanism": true,
	"certfile": true, "keyfile": true, "cacertfile": true, "server_name_indication": true,
}

// urlParams are idemq's URL parameters. The options name themselves in
// their errors, whether given by URL or in code.
var urlParams = urlparam.Table[Option]{Scheme: "rabbitmq", Params: map[string]urlparam.Param[Option]{
	"queue":      urlparam.Text("WithQueue", WithQueue),
	"queue_type": urlparam.Text("WithQueueType", func(v string) Option { return WithQueueType(QueueType(v)) }),
	"retry": urlparam.Choice("WithRetryMode", map[string]Option{
		"requeue": WithRetryMode(RetryRequeue), "queue": WithRetryMode(RetryViaQueue),
	}),
	"dead_letter": urlparam.Choice("WithDeadLetterMode", map[string]Option{
		"republish": WithDeadLetterMode(DeadLetterRepublish), "reject": WithDeadLetterMode(DeadLetterReject),
	}),
	"declare":           urlparam.Bool("WithDeclare", WithDeclare),
	"prefetch":          urlparam.Int("WithPrefetch", WithPrefetch),
	"delivery_limit":    urlparam.Int("WithDeliveryLimit", WithDeliveryLimit),
	"message_ttl":       urlparam.Duration("WithMessageTTL", WithMessageTTL),
	"policy_ttl":        urlparam.Duration("WithPolicyTTL", WithPolicyTTL),
	"dead_letter_queue": urlparam.Text("WithDeadLetterQueue", WithDeadLetterQueue),
	"retry_queue":       urlparam.Text("WithRetryQueue", WithRetryQueue),
	"connection_name":   urlparam.Text("WithConnectionName", WithConnectionName),
	"exchange":          urlparam.Text("WithExchange", WithExchange),
	"id_header":         urlparam.Text("WithIDHeader", WithIDHeader),
}}

// readURL splits addr into the URL for amqp091-go (its nodes, user,
// vhost and amqp091-go's parameters), the queue it names ("" for none)
// and the options its idemq parameters ask for, the queue's among them.
func readURL(addr string) (amqpURL, queue string, opts []Option, err error) {
	ns, err := splitNodes(addr)
	if err != nil {
		return "", "", nil, err
	}
	// Every node's URL has the same scheme, user information, vhost and
	// query: read them from the first.
	u, err := redact.ParseURL(ns.urls[0])
	if err != nil {
		return "", "", nil, fmt.Errorf("rabbitmq: url: %w", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", "", nil, fmt.Errorf("rabbitmq: url: scheme %q is not amqp or amqps", u.Scheme)
	}
	q, err := redact.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", "", nil, fmt.Errorf("rabbitmq: url parameters: %w", err)
	}
	for k, vs := range q {
		if len(vs) != 1 && !amqpParams[k] {
			return "", "", nil, fmt.Errorf("rabbitmq: url parameter %s: given %d times", redact.Name(k), len(vs))
		}
	}
	queue = q.Get("queue")
	if opts, err = urlParams.Take(q); err != nil {
		return "", "", nil, err
	}
	for k := range q {
		if !amqpParams[k] {
			return "", "", nil, urlParams.Unknown(k, slices.Collect(maps.Keys(amqpParams))...)
		}
	}
	u.RawQuery = q.Encode()
	if len(ns.hosts) > 1 {
		u.Host = strings.Join(ns.hosts, ",")
	}
	return u.String(), queue, opts, nil
}

// parseSourceURL is readURL for a URL that must name the queue, as one
// opened by scheme does.
func parseSourceURL(addr string) (string, string, []Option, error) {
	amqpURL, queue, opts, err := readURL(addr)
	if err == nil && queue == "" {
		err = errors.New("rabbitmq: url parameter queue: required")
	}
	return amqpURL, queue, opts, err
}

// openConfig reads addr and checks it with opts, which come after the
// URL's parameters.
func openConfig(addr string, opts []Option) (config, nodes, error) {
	amqpURL, queue, urlOpts, err := readURL(addr)
	if err != nil {
		return config{}, nodes{}, err
	}
	return sourceConfig(amqpURL, queue, append(urlOpts, opts...))
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	var opts []Option
	if cfg.Logger != nil {
		opts = append(opts, WithLogger(cfg.Logger))
	}
	return Open(ctx, u.String(), opts...)
}

// openPublisherURL opens a Publisher to the queue the URL names (see
// NewPublisher). It does not log, so cfg.Logger has nothing to reach.
func openPublisherURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
	if _, _, _, err := parseSourceURL(u.String()); err != nil {
		return nil, err
	}
	p, err := NewPublisher(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: publisher: %w", err)
	}
	return p, nil
}

func openDeadLettersURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (admin.DeadLetterQueue, error) {
	return OpenDeadLetters(ctx, u.String())
}

// parseNodes splits url into its nodes and checks each node's URL as
// amqp091-go will read it.
func parseNodes(url string) (nodes, error) {
	ns, err := splitNodes(url)
	if err != nil {
		return nodes{}, err
	}
	for _, u := range ns.urls {
		if _, err := amqp.ParseURI(u); err != nil {
			return nodes{}, urlError(u, err)
		}
	}
	return ns, nil
}

// urlError reports a URL amqp091-go refuses without its secrets: one that
// does not parse is not shown (no rule knows where its password ends).
func urlError(rawURL string, err error) error {
	if _, perr := redact.ParseURL(rawURL); perr != nil {
		return fmt.Errorf("rabbitmq: url: %w", perr)
	}
	return fmt.Errorf("rabbitmq: url %s: %s", redact.URL(rawURL), redact.Error(err, rawURL))
}

// nodes is the parsed form of a URL that may name several nodes of a
// cluster, amqp://user:pass@h1:5672,h2:5673/vhost?…: each node's
// host[:port] and URL (with the URL's user, password, vhost and query).
type nodes struct{ hosts, urls []string }

// splitNodes splits the comma-separated host list of rawURL into one URL
// per node; a URL naming one host is left for amqp091-go to check. A bad
// entry is an error naming it (host names are shown, the user information
// never is).
func splitNodes(rawURL string) (nodes, error) {
	single := nodes{urls: []string{rawURL}}
	i := strings.Index(rawURL, "://")
	if i < 0 {
		return single, nil
	}
	start := i + len("://")
	end := len(rawURL)
	if j := strings.IndexAny(rawURL[start:], "/?#"); j >= 0 {
		end = start + j
	}
	hostStart := start + strings.LastIndex(rawURL[start:end], "@") + 1
	if !strings.Contains(rawURL[hostStart:end], ",") {
		if u, err := url.Parse(rawURL); err == nil {
			single.hosts = []string{u.Host}
		}
		return single, nil
	}
	hosts := strings.Split(rawURL[hostStart:end], ",")
	n := nodes{hosts: hosts, urls: make([]string, len(hosts))}
	shown := redact.URL(rawURL)
	for k, h := range hosts {
		if err := checkHostPort(h); err != nil {
			if !strings.Contains(shown, h) {
				// A password with a raw '/' or ',' put this entry here: the
				// text may be part of it.
				err = errors.New("not a host:port (not shown: it may hold a password)")
			}
			return nodes{}, fmt.Errorf("rabbitmq: url host list: node %d of %d: %w", k+1, len(hosts), err)
		}
		n.urls[k] = rawURL[:hostStart] + h + rawURL[end:]
	}
	return n, nil
}

// checkHostPort checks one entry of a URL's host list: a host name or IP
// address (IPv6 in brackets), optionally with a numeric port.
func checkHostPort(h string) error {
	if h == "" {
		return errors.New("empty host")
	}
	host, port := h, ""
	if strings.HasPrefix(h, "[") {
		k := strings.Index(h, "]")
		if k < 0 {
			return fmt.Errorf("%q: no ']' after the IPv6 address", h)
		}
		host, port = h[:k+1], strings.TrimPrefix(h[k+1:], ":")
		if rest := h[k+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
			return fmt.Errorf("%q: %q after the IPv6 address", h, rest)
		}
	} else if k := strings.LastIndex(h, ":"); k >= 0 {
		host, port = h[:k], h[k+1:]
	}
	if host == "" || host == "[]" {
		return fmt.Errorf("%q: empty host", h)
	}
	if strings.ContainsAny(host, ":@ ") && !strings.HasPrefix(host, "[") {
		return fmt.Errorf("%q: not a host:port", h)
	}
	if port != "" || strings.HasSuffix(h, ":") {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("%q: port %q is not a number in 1..65535", h, port)
		}
	}
	return nil
}

// host returns node i's host[:port] for logs and errors.
func (ns nodes) host(i int) string {
	if i < len(ns.hosts) {
		return ns.hosts[i]
	}
	return "#" + strconv.Itoa(i+1)
}
