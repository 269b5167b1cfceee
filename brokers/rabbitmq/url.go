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
		v := vs[0]
		switch k {
		case "queue":
			queue = v
		case "queue_type":
			opts = append(opts, WithQueueType(QueueType(v)))
		case "retry":
			switch v {
			case "requeue":
				opts = append(opts, WithRetryMode(RetryRequeue))
			case "queue":
				opts = append(opts, WithRetryMode(RetryViaQueue))
			default:
				return "", "", nil, errors.New("rabbitmq: url parameter retry: not requeue or queue")
			}
		case "dead_letter":
			switch v {
			case "republish":
				opts = append(opts, WithDeadLetterMode(DeadLetterRepublish))
			case "reject":
				opts = append(opts, WithDeadLetterMode(DeadLetterReject))
			default:
				return "", "", nil, errors.New("rabbitmq: url parameter dead_letter: not republish or reject")
			}
		case "declare":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return "", "", nil, errors.New("rabbitmq: url parameter declare: not a boolean")
			}
			opts = append(opts, WithDeclare(b))
		case "prefetch":
			n, err := strconv.Atoi(v)
			if err != nil {
				return "", "", nil, errors.New("rabbitmq: url parameter prefetch: not a number")
			}
			opts = append(opts, WithPrefetch(n))
		case "delivery_limit":
			n, err := strconv.Atoi(v)
			if err != nil {
				return "", "", nil, errors.New("rabbitmq: url parameter delivery_limit: not a number")
			}
			opts = append(opts, WithDeliveryLimit(n))
		case "dead_letter_queue":
			opts = append(opts, WithDeadLetterQueue(v))
		case "retry_queue":
			opts = append(opts, WithRetryQueue(v))
		case "connection_name":
			opts = append(opts, WithConnectionName(v))
		default:
			if !amqpParams[k] {
				return "", "", nil, fmt.Errorf("rabbitmq: url parameter %s: unknown", redact.Name(k))
			}
			keep[k] = vs
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
