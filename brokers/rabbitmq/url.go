package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
)

// OpenURL opens a Source configured entirely by a URL, so deployment
// configuration rather than code picks the broker and its settings:
//
//	amqp://user:pass@host:5672/vhost?queue=payments&queue_type=quorum&retry=queue
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

// urlParams maps each idemq URL parameter (but queue) to the option its
// value asks for.
var urlParams = map[string]func(v string) (Option, error){
	"queue_type": func(v string) (Option, error) { return WithQueueType(QueueType(v)), nil },
	"retry": oneOf(map[string]Option{
		"requeue": WithRetryMode(RetryRequeue), "queue": WithRetryMode(RetryViaQueue),
	}, "not requeue or queue"),
	"dead_letter": oneOf(map[string]Option{
		"republish": WithDeadLetterMode(DeadLetterRepublish), "reject": WithDeadLetterMode(DeadLetterReject),
	}, "not republish or reject"),
	"declare": func(v string) (Option, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.New("not a boolean")
		}
		return WithDeclare(b), nil
	},
	"prefetch":          number(WithPrefetch),
	"delivery_limit":    number(WithDeliveryLimit),
	"dead_letter_queue": text(WithDeadLetterQueue),
	"retry_queue":       text(WithRetryQueue),
	"connection_name":   text(WithConnectionName),
	"exchange":          text(WithExchange),
	"id_header":         text(WithIDHeader),
}

// oneOf reads a parameter whose values are the keys of opts.
func oneOf(opts map[string]Option, bad string) func(string) (Option, error) {
	return func(v string) (Option, error) {
		if o, ok := opts[v]; ok {
			return o, nil
		}
		return nil, errors.New(bad)
	}
}

// number reads an integer parameter; the option checks its range.
func number(opt func(int) Option) func(string) (Option, error) {
	return func(v string) (Option, error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, errors.New("not a number")
		}
		return opt(n), nil
	}
}

// text reads a parameter whose value the option takes as it is.
func text(opt func(string) Option) func(string) (Option, error) {
	return func(v string) (Option, error) { return opt(v), nil }
}

// parseSourceURL splits rawURL into the URL for amqp091-go, the queue and
// the options its idemq parameters ask for.
func parseSourceURL(rawURL string) (string, string, []Option, error) {
	u, err := redact.ParseURL(rawURL)
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
	keep := url.Values{}
	var opts []Option
	queue := ""
	for k, vs := range q {
		if len(vs) != 1 && !amqpParams[k] {
			return "", "", nil, fmt.Errorf("rabbitmq: url parameter %s: given %d times", redact.Name(k), len(vs))
		}
		param, known := urlParams[k]
		switch {
		case k == "queue":
			queue = vs[0]
		case known:
			o, err := param(vs[0])
			if err != nil {
				return "", "", nil, fmt.Errorf("rabbitmq: url parameter %s: %w", k, err)
			}
			opts = append(opts, o)
		case amqpParams[k]:
			keep[k] = vs
		default:
			return "", "", nil, fmt.Errorf("rabbitmq: url parameter %s: unknown", redact.Name(k))
		}
	}
	if queue == "" {
		return "", "", nil, fmt.Errorf("rabbitmq: url parameter queue: required")
	}
	u.RawQuery = keep.Encode()
	return u.String(), queue, opts, nil
}

// urlError reports a URL that amqp091-go refuses without its secrets: one
// that does not parse is not shown at all (no rule knows where its
// password ends), one that parses is shown redacted.
func urlError(rawURL string, err error) error {
	if _, perr := redact.ParseURL(rawURL); perr != nil {
		return fmt.Errorf("rabbitmq: url: %w", perr)
	}
	return fmt.Errorf("rabbitmq: url %s: %s", core.Redact(rawURL), core.RedactError(err, rawURL))
}
