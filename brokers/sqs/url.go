package sqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// viaRegistry is the option a registry opener gives: the registry's logger,
// if any, and errors that keep naming the URL's parameters.
func viaRegistry(oc driver.OpenConfig) Option {
	return sourceOption(func(c *config) error {
		c.logger, c.byURL = cmp.Or(oc.Logger, c.logger), true
		return nil
	})
}

// urlParams are the parameters of sqs:// URLs; a Publisher takes the
// ClientOptions among them and checks but ignores the rest. init fills it
// (the options' errors name their parameters) and registers the scheme.
var urlParams urlparam.Table[Option]

func init() {
	urlParams = urlparam.Table[Option]{Scheme: "sqs", Params: map[string]urlparam.Param[Option]{
		"endpoint":         urlparam.Text("WithEndpoint", asOption(WithEndpoint)),
		"region":           urlparam.Text("WithRegion", asOption(WithRegion)),
		"id_attribute":     urlparam.Text("WithIDAttribute", asOption(WithIDAttribute)),
		"id_header":        urlparam.Text("", asOption(WithIDAttribute)), // the name core's missing-id causes give
		"dlq":              urlparam.Text("WithDeadLetterQueue", WithDeadLetterQueue),
		"dead_letter_mode": urlparam.Choice("WithDeadLetterMode", map[string]Option{"send": WithDeadLetterMode(DeadLetterSend), "redrive": WithDeadLetterMode(DeadLetterRedrive)}),
		"heartbeat":        urlparam.Bool("WithHeartbeat", WithHeartbeat),
		"receivers":        urlparam.Int("WithReceivers", WithReceivers),
		"wait":             urlparam.Duration("WithWaitTime", WithWaitTime),
		"visibility":       urlparam.Duration("WithVisibilityTimeout", WithVisibilityTimeout),
		"max_extension":    urlparam.Duration("WithMaxExtension", WithMaxExtension),
		"close_timeout":    urlparam.Duration("WithCloseTimeout", WithCloseTimeout),
	}}
	driver.RegisterSource("sqs", func(ctx context.Context, u *url.URL, oc driver.OpenConfig) (driver.Source, error) {
		return Open(ctx, u.String(), viaRegistry(oc))
	})
	driver.RegisterPublisher("sqs", func(ctx context.Context, u *url.URL, _ driver.OpenConfig) (driver.Publisher, error) {
		return NewPublisher(ctx, u.String())
	})
	driver.RegisterDeadLetters("sqs", func(ctx context.Context, u *url.URL, oc driver.OpenConfig) (driver.DeadLetters, error) {
		return OpenDeadLetters(ctx, u.String(), viaRegistry(oc))
	})
}

func asOption[T any](o func(T) ClientOption) func(T) Option { return func(v T) Option { return o(v) } }

// parseURL reads sqs://[KEY:SECRET@]QUEUE?… or
// sqs://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE?… (a queue URL, https) into
// the queue and options (a Publisher's, unless source).
func parseURL(u *url.URL, source bool) (queue string, opts []Option, err error) {
	queue = u.Host
	if p := strings.Trim(u.Path, "/"); p != "" {
		queue = "https://" + u.Host + "/" + p
	}
	if queue == "" {
		return "", nil, fmt.Errorf("sqs URL has no queue (use sqs://orders or sqs://sqs.REGION.amazonaws.com/ACCOUNT/orders)")
	}
	if u.User != nil {
		secret, ok := u.User.Password()
		if !ok {
			return "", nil, fmt.Errorf("sqs URL credentials need both an access key id and a secret (sqs://KEY:SECRET@queue)")
		}
		opts = append(opts, WithStaticCredentials(u.User.Username(), secret, ""))
	}
	query, err := urlparam.ParseQuery(u.RawQuery)
	if err != nil {
		return "", nil, fmt.Errorf("sqs URL parameters: %w", err)
	}
	for k, vs := range query {
		query[k] = vs[len(vs)-1:] // the last value counts
	}
	all, err := urlParams.Read(query) // every parameter is checked
	if err != nil {
		return "", nil, err
	}
	for _, o := range all {
		if _, client := o.(PublisherOption); client || source {
			opts = append(opts, o)
		}
	}
	return queue, opts, nil
}

// setup reads addr, an sqs:// URL, then opts, and finds the queue: the
// start every constructor shares. Errors name URL parameters unless
// options were given in code.
func setup[O Option](ctx context.Context, what, addr string, source bool, opts []O) (config, *awssqs.Client, *queueInfo, error) {
	cfg := defaultConfig()
	u, err := urlparam.ParseURL(addr)
	if err == nil && u.Scheme != "sqs" {
		err = errors.New("not an sqs:// URL (sqs://QUEUE?region=…, sqs://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE)")
	}
	if err != nil {
		return cfg, nil, nil, fmt.Errorf("sqs: %s: address: %w", what, err)
	}
	queue, fromURL, err := parseURL(u, source)
	if err != nil {
		return cfg, nil, nil, err
	}
	n := len(fromURL)
	for _, o := range opts {
		if any(o) != nil {
			fromURL = append(fromURL, o)
		}
	}
	for i, o := range fromURL {
		cfg.byURL = i < n || len(opts) == 0
		if err := o.apply(&cfg); err != nil {
			return cfg, nil, nil, err
		}
	}
	cl, err := newClient(ctx, cfg.clientConfig)
	if err != nil {
		return cfg, nil, nil, err
	}
	q, err := resolveQueue(ctx, cl, queue)
	if err != nil {
		return cfg, nil, nil, fmt.Errorf("sqs: %s: %w", what, err)
	}
	return cfg, cl, q, nil
}
