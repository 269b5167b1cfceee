package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/core/driver"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("sqs", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("sqs", openDeadLettersURL)
}

// urlParam is one URL parameter understood by core.OpenSource and
// core.OpenPublisher for sqs:// URLs: the option it sets and how its value
// is read. A Publisher uses the client ones and id_attribute, and checks
// but ignores the Source's own, so that one URL serves both sides (as
// amqp:// and kafka:// URLs do).
type urlParam struct {
	option string
	source bool // Source only
	build  func(v string) (Option, error)
}

var urlParams = map[string]urlParam{
	"endpoint":     {"WithEndpoint", false, func(v string) (Option, error) { return WithEndpoint(v), nil }},
	"region":       {"WithRegion", false, func(v string) (Option, error) { return WithRegion(v), nil }},
	"id_attribute": {"WithIDAttribute", false, func(v string) (Option, error) { return WithIDAttribute(v), nil }},
	"dlq":          {"WithDeadLetterQueue", true, func(v string) (Option, error) { return WithDeadLetterQueue(v), nil }},
	"dead_letter_mode": {"WithDeadLetterMode", true, func(v string) (Option, error) {
		m, ok := map[string]DeadLetterMode{"send": DeadLetterSend, "redrive": DeadLetterRedrive}[v]
		if !ok {
			return nil, errors.New("not send or redrive")
		}
		return WithDeadLetterMode(m), nil
	}},
	"heartbeat": {"WithHeartbeat", true, func(v string) (Option, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, errors.New("not a boolean")
		}
		return WithHeartbeat(b), nil
	}},
	"receivers":     intParam("WithReceivers", WithReceivers),
	"window":        intParam("WithWindow", WithWindow),
	"wait":          durationParam("WithWaitTime", WithWaitTime),
	"visibility":    durationParam("WithVisibilityTimeout", WithVisibilityTimeout),
	"max_extension": durationParam("WithMaxExtension", WithMaxExtension),
	"close_timeout": durationParam("WithCloseTimeout", WithCloseTimeout),
}

func intParam(option string, o func(int) Option) urlParam {
	return urlParam{option, true, func(v string) (Option, error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, errors.New("not a number")
		}
		return o(n), nil
	}}
}

func durationParam(option string, o func(time.Duration) Option) urlParam {
	return urlParam{option, true, func(v string) (Option, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, errors.New("not a duration")
		}
		return o(d), nil
	}}
}

// paramOfOption names the URL parameter (or URL part) that sets an option,
// for errors of URL-opened sources and publishers.
var paramOfOption = map[string]string{"WithStaticCredentials": "credentials (sqs://KEY:SECRET@queue)"}

func init() {
	for p, up := range urlParams {
		paramOfOption[up.option] = p
	}
}

// byURL marks a configuration as coming from a URL, so that its errors
// name URL parameters; it comes first among a URL's options.
func byURL(c *config) error {
	c.byURL = true
	return nil
}

// parseURL reads
//
//	sqs://QUEUE?region=R&endpoint=http://127.0.0.1:9324&…
//	sqs://ACCESS_KEY:SECRET@QUEUE?endpoint=…           (static credentials, for emulators)
//	sqs://sqs.eu-west-1.amazonaws.com/123456789012/QUEUE  (a queue URL, https)
//
// into the queue and options. Without credentials in the URL the AWS
// credential chain is used. A logger in cfg is used as WithLogger would be.
func parseURL(u *url.URL, source bool, cfg driver.OpenConfig) (queue string, opts []Option, err error) {
	queue = u.Host
	if p := strings.Trim(u.Path, "/"); p != "" {
		queue = "https://" + u.Host + "/" + p
	}
	if queue == "" {
		return "", nil, fmt.Errorf("sqs URL has no queue (use sqs://orders or sqs://sqs.REGION.amazonaws.com/ACCOUNT/orders)")
	}
	opts = []Option{byURL}
	if cfg.Logger != nil {
		opts = append(opts, WithLogger(cfg.Logger))
	}
	if u.User != nil {
		secret, ok := u.User.Password()
		if !ok {
			return "", nil, fmt.Errorf("sqs URL credentials need both an access key id and a secret (sqs://KEY:SECRET@queue)")
		}
		opts = append(opts, WithStaticCredentials(u.User.Username(), secret, ""))
	}
	query, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", nil, fmt.Errorf("sqs URL parameters: %w", err)
	}
	known := make([]string, 0, len(urlParams))
	for k := range urlParams {
		known = append(known, k)
	}
	sort.Strings(known)
	keys := make([]string, 0, len(query))
	for k := range query {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p, ok := urlParams[k]
		if !ok {
			return "", nil, fmt.Errorf("sqs URL: unknown parameter %q (known: %s)", redact.Name(k), strings.Join(known, ", "))
		}
		o, err := p.build(query[k][len(query[k])-1])
		if err != nil {
			return "", nil, fmt.Errorf("sqs URL parameter %s: %w", k, err)
		}
		if p.source && !source {
			continue // the Source's: checked, not used
		}
		opts = append(opts, o)
	}
	return queue, opts, nil
}

func openSourceURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Source, error) {
	queue, opts, err := parseURL(u, true, cfg)
	if err != nil {
		return nil, err
	}
	return Open(ctx, queue, opts...)
}

func openPublisherURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (driver.Publisher, error) {
	queue, opts, err := parseURL(u, false, cfg)
	if err != nil {
		return nil, err
	}
	return NewPublisher(ctx, queue, opts...)
}
