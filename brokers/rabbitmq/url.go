package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/hostlist"
	"github.com/idemq/idemq/core/driver/urlparam"
)

func init() {
	for _, scheme := range []string{"amqp", "amqps"} {
		driver.RegisterSource(scheme, openSourceURL)
		driver.RegisterPublisher(scheme, openPublisherURL)
		driver.RegisterDeadLetters(scheme, openDeadLettersURL)
	}
}

// amqpParams are the URI query parameters left to amqp091-go.
var amqpParams = []string{"heartbeat", "connection_timeout", "channel_max", "auth_mechanism",
	"certfile", "keyfile", "cacertfile", "server_name_indication"}

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
	u, err := urlparam.ParseURL(ns.URLs[0])
	if err != nil {
		return "", "", nil, fmt.Errorf("rabbitmq: url: %w", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", "", nil, fmt.Errorf("rabbitmq: url: scheme %q is not amqp or amqps", u.Scheme)
	}
	q, err := urlparam.ParseQuery(u.RawQuery) // u.Query() would drop a pair with a ';' silently
	if err != nil {
		return "", "", nil, fmt.Errorf("rabbitmq: url parameters: %w", err)
	}
	queue = q.Get("queue")
	if opts, err = urlParams.Split(q, amqpParams...); err != nil {
		return "", "", nil, err
	}
	u.RawQuery = q.Encode()
	if len(ns.Hosts) > 1 {
		u.Host = strings.Join(ns.Hosts, ",")
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
func openConfig(addr string, opts []Option) (config, hostlist.List, error) {
	amqpURL, queue, urlOpts, err := readURL(addr)
	if err != nil {
		return config{}, hostlist.List{}, err
	}
	return sourceConfig(amqpURL, queue, append(urlOpts, opts...))
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	return Open(ctx, u.String(), driver.LoggerOption(cfg, WithLogger))
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

func openDeadLettersURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.DeadLetters, error) {
	return OpenDeadLetters(ctx, u.String())
}

// parseNodes splits url into its nodes and checks each node's URL as
// amqp091-go will read it.
func parseNodes(url string) (hostlist.List, error) {
	ns, err := splitNodes(url)
	if err != nil {
		return hostlist.List{}, err
	}
	for _, u := range ns.URLs {
		if _, err := amqp.ParseURI(u); err != nil {
			// Told without secrets; a URL that does not parse is not shown
			// (no rule knows where its password ends).
			if _, perr := urlparam.ParseURL(u); perr != nil {
				return hostlist.List{}, fmt.Errorf("rabbitmq: url: %w", perr)
			}
			return hostlist.List{}, fmt.Errorf("rabbitmq: url %s: %s", urlparam.Redact(u), urlparam.RedactError(err, u))
		}
	}
	return ns, nil
}

// splitNodes is hostlist.Split with this package's prefix on its errors.
func splitNodes(url string) (hostlist.List, error) {
	ns, err := hostlist.Split(url)
	if err != nil {
		return ns, fmt.Errorf("rabbitmq: %w", err)
	}
	return ns, nil
}
