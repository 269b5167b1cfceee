package sqs

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/urlparam"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/redact"
)

func init() {
	driver.RegisterBroker("sqs", openSourceURL, openPublisherURL)
	admin.RegisterDeadLetters("sqs", openDeadLettersURL)
}

// urlParams are the parameters of sqs:// URLs. A Publisher uses the
// client ones and id_attribute (clientParams), and checks but ignores the
// Source's own, so that one URL serves both sides (as amqp:// and kafka://
// URLs do). init fills them: the options' errors name their parameters.
var urlParams, clientParams urlparam.Table[Option]

func init() {
	client := map[string]urlparam.Param[Option]{
		"endpoint":     urlparam.Text("WithEndpoint", WithEndpoint),
		"region":       urlparam.Text("WithRegion", WithRegion),
		"id_attribute": urlparam.Text("WithIDAttribute", WithIDAttribute),
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

// paramOf names the URL parameter (or URL part) that sets an option, for
// errors of URL-opened sources and publishers.
func paramOf(option string) (string, bool) {
	if option == "WithStaticCredentials" {
		return "credentials (sqs://KEY:SECRET@queue)", true
	}
	return urlParams.NameOf(option)
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
	opts = append(opts, all...)
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
