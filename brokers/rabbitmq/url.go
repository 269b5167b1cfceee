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

	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

// OpenURL opens a Source configured entirely by a URL, so deployment
// configuration rather than code picks the broker and its settings:
//
//	amqp://user:pass@host:5672/vhost?queue=payments&queue_type=quorum&retry=queue
//
// For a cluster, list its nodes, comma-separated, in place of host:port:
//
//	amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost?queue=payments&queue_type=quorum&delivery_limit=5
//
// Every node gets the same user, password, vhost and parameters. The
// Source connects first to a node picked at random, tries the next node in
// the list at once when a dial fails, and after a connection loss starts
// with the node after the one it lost (see Open). On a cluster use a
// quorum queue (queue_type=quorum, with a delivery_limit): a classic queue
// lives on one node and is gone while that node is down. An empty entry in
// the node list or a port that is not a number is an error naming it.
// core.OpenSource and core.OpenPublisher check the URL with net/url before
// it reaches this package, which takes such a list when every node names
// its port (h1:5672,h2:5672) and none is an IPv6 literal.
//
// Parameters (each maps to the option of the same meaning):
//
//	queue            the queue to consume (required)
//	queue_type       classic | quorum                      (WithQueueType)
//	retry            requeue | queue                       (WithRetryMode)
//	dead_letter      republish | reject                    (WithDeadLetterMode)
//	declare          true | false                          (WithDeclare)
//	prefetch         1..65535                              (WithPrefetch)
//	delivery_limit   0.. (quorum queues)                   (WithDeliveryLimit)
//	message_ttl      a duration, e.g. 168h                 (WithMessageTTL)
//	policy_ttl       a duration, e.g. 72h                  (WithPolicyTTL)
//	dead_letter_queue, retry_queue                         (WithDeadLetterQueue, WithRetryQueue)
//	connection_name  the client connection name            (WithConnectionName)
//	exchange         the exchange producers publish to     (WithExchange)
//	id_header        the header holding the business id    (WithIDHeader)
//
// RabbitMQ's own URI parameters (heartbeat, connection_timeout,
// channel_max, auth_mechanism, and for amqps:// the TLS files cacertfile,
// certfile, keyfile and server_name_indication) are left to amqp091-go:
// amqps:// verifies the server against cacertfile (default: the system
// roots) and the host name (or server_name_indication), and sends the
// client certificate when certfile and keyfile are given. Any other
// parameter is an error naming it. URL parameters are applied after opts,
// so the deployment's URL wins over defaults set in code.
func OpenURL(ctx context.Context, rawURL string, opts ...Option) (*Source, error) {
	amqpURL, queue, urlOpts, err := parseSourceURL(rawURL)
	if err != nil {
		return nil, err
	}
	return Open(ctx, amqpURL, queue, append(append([]Option{}, opts...), urlOpts...)...)
}

// amqpParams are the URI query parameters amqp091-go understands.
var amqpParams = map[string]bool{
	"heartbeat": true, "connection_timeout": true, "channel_max": true, "auth_mechanism": true,
	"certfile": true, "keyfile": true, "cacertfile": true, "server_name_indication": true,
}

// urlParams are the idemq URL parameters but queue. The options name
// themselves in their errors, whether opened by URL or from code.
var urlParams = urlparam.Table[Option]{Scheme: "rabbitmq", Params: map[string]urlparam.Param[Option]{
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

// parseSourceURL splits rawURL into the URL for amqp091-go, the queue and
// the options its idemq parameters ask for.
func parseSourceURL(rawURL string) (string, string, []Option, error) {
	ns, err := splitNodes(rawURL)
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
	queue := q.Get("queue")
	q.Del("queue")
	opts, err := urlParams.Take(q)
	if err != nil {
		return "", "", nil, err
	}
	for k := range q {
		if !amqpParams[k] {
			return "", "", nil, urlParams.Unknown(k, append([]string{"queue"}, slices.Collect(maps.Keys(amqpParams))...)...)
		}
	}
	keep := q
	if queue == "" {
		return "", "", nil, fmt.Errorf("rabbitmq: url parameter queue: required")
	}
	u.RawQuery = keep.Encode()
	if len(ns.hosts) > 1 {
		u.Host = strings.Join(ns.hosts, ",")
	}
	return u.String(), queue, opts, nil
}

// urlError reports a URL that amqp091-go refuses without its secrets: one
// that does not parse is not shown at all (no rule knows where its
// password ends), one that parses is shown redacted.
func urlError(rawURL string, err error) error {
	if _, perr := redact.ParseURL(rawURL); perr != nil {
		return fmt.Errorf("rabbitmq: url: %w", perr)
	}
	return fmt.Errorf("rabbitmq: url %s: %s", redact.URL(rawURL), redact.Error(err, rawURL))
}

// nodes is the parsed form of a URL that may name several nodes of a
// cluster: amqp://user:pass@h1:5672,h2:5673/vhost?… .
type nodes struct {
	// hosts are the host[:port] of each node, in the order of the URL.
	hosts []string
	// urls are one URL per node, each with the URL's user, password,
	// vhost and query.
	urls []string
}

// splitNodes splits the comma-separated host list in the authority of
// rawURL into one URL per node. A URL naming one host is its own single
// node, left as it is for amqp091-go to check. An empty entry in the list
// or a port that is not a number in 1..65535 is an error naming that part
// of the URL (host names are shown, the user information never is).
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
	authority := rawURL[start:end]
	hostStart := start + strings.LastIndex(authority, "@") + 1
	hostList := rawURL[hostStart:end]
	if !strings.Contains(hostList, ",") {
		u, err := url.Parse(rawURL)
		if err == nil {
			single.hosts = []string{u.Host}
		}
		return single, nil
	}
	hosts := strings.Split(hostList, ",")
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
