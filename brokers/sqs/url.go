package sqs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strings"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("sqs", func(ctx context.Context, u *url.URL, oc driver.OpenConfig) (driver.Source, error) {
		return openSource(ctx, u, oc, nil)
	}, func(ctx context.Context, u *url.URL, oc driver.OpenConfig) (driver.Publisher, error) {
		return newPublisher(ctx, u, oc, nil)
	})
	admin.RegisterDeadLetters("sqs", func(ctx context.Context, u *url.URL, oc driver.OpenConfig) (admin.DeadLetterQueue, error) {
		return openDeadLetters(ctx, u, oc, nil)
	})
}

// urlParams are the parameters of sqs:// URLs. A Publisher uses the
// client ones (clientParams) and checks but ignores the Source's own, so
// that one URL serves both sides. init fills them: the options' errors
// name their parameters.
var urlParams, clientParams urlparam.Table[Option]

func init() {
	client := map[string]urlparam.Param[Option]{
		"endpoint":     urlparam.Text("WithEndpoint", asOption(WithEndpoint)),
		"region":       urlparam.Text("WithRegion", asOption(WithRegion)),
		"id_attribute": urlparam.Text("WithIDAttribute", asOption(WithIDAttribute)),
	}
	all := map[string]urlparam.Param[Option]{
		"dlq":              urlparam.Text("WithDeadLetterQueue", WithDeadLetterQueue),
		"dead_letter_mode": urlparam.Choice("WithDeadLetterMode", map[string]Option{"send": WithDeadLetterMode(DeadLetterSend), "redrive": WithDeadLetterMode(DeadLetterRedrive)}),
		"heartbeat":        urlparam.Bool("WithHeartbeat", WithHeartbeat),
		"receivers":        urlparam.Int("WithReceivers", WithReceivers),
		"window":           urlparam.Int("WithWindow", WithWindow),
		"wait":             urlparam.Duration("WithWaitTime", WithWaitTime),
		"visibility":       urlparam.Duration("WithVisibilityTimeout", WithVisibilityTimeout),
		"max_extension":    urlparam.Duration("WithMaxExtension", WithMaxExtension),
		"close_timeout":    urlparam.Duration("WithCloseTimeout", WithCloseTimeout),
	}
	maps.Copy(all, client)
	urlParams = urlparam.Table[Option]{Scheme: "sqs", Params: all}
	clientParams = urlparam.Table[Option]{Scheme: "sqs", Params: client}
}

func asOption[T any](o func(T) ClientOption) func(T) Option { return func(v T) Option { return o(v) } }

// paramOf names the URL parameter (or URL part) that sets an option.
func paramOf(option string) (string, bool) {
	if option == "WithStaticCredentials" {
		return "credentials (sqs://KEY:SECRET@queue)", true
	}
	return urlParams.NameOf(option)
}

// parseAddr parses the address a constructor is given.
func parseAddr(what, addr string) (*url.URL, error) {
	u, err := redact.ParseURL(addr)
	if err == nil && u.Scheme != "sqs" {
		err = errors.New("not an sqs:// URL (sqs://QUEUE?region=…, sqs://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE)")
	}
	if err != nil {
		return nil, fmt.Errorf("sqs: %s: address: %w", what, err)
	}
	return u, nil
}

// parseURL reads
//
//	sqs://QUEUE?region=R&endpoint=http://127.0.0.1:9324&…
//	sqs://ACCESS_KEY:SECRET@QUEUE?endpoint=…           (static credentials, for emulators)
//	sqs://sqs.eu-west-1.amazonaws.com/123456789012/QUEUE  (a queue URL, https)
//
// into the queue and options (a Publisher's, unless source). Without
// credentials in the URL the AWS credential chain is used. A logger in oc
// is used as WithLogger would be.
func parseURL(u *url.URL, source bool, oc driver.OpenConfig) (queue string, opts []Option, err error) {
	queue = u.Host
	if p := strings.Trim(u.Path, "/"); p != "" {
		queue = "https://" + u.Host + "/" + p
	}
	if queue == "" {
		return "", nil, fmt.Errorf("sqs URL has no queue (use sqs://orders or sqs://sqs.REGION.amazonaws.com/ACCOUNT/orders)")
	}
	if oc.Logger != nil && source {
		opts = append(opts, WithLogger(oc.Logger))
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
	for k, vs := range query {
		query[k] = vs[len(vs)-1:] // the last value counts
	}
	all, err := urlParams.Read(query) // every parameter is checked
	if err != nil {
		return "", nil, err
	}
	if !source {
		all, _ = clientParams.Take(query) // the Source's own are not used
	}
	return queue, append(opts, all...), nil
}

// setup reads u (and a logger in oc) and then opts, and finds the queue:
// the start every constructor shares. Errors name URL parameters unless
// options were given in code.
func setup[O Option](ctx context.Context, what string, u *url.URL, oc driver.OpenConfig, source bool, opts []O) (config, *awssqs.Client, *queueInfo, error) {
	cfg := defaultConfig()
	queue, byURL, err := parseURL(u, source, oc)
	if err != nil {
		return cfg, nil, nil, err
	}
	cfg.byURL = true
	for _, o := range byURL {
		if err := o.apply(&cfg); err != nil {
			return cfg, nil, nil, err
		}
	}
	cfg.byURL = len(opts) == 0
	for _, o := range opts {
		if any(o) == nil {
			continue
		}
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
