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

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/internal/redact"
)

func init() { driver.RegisterBroker("sqs", openSourceURL, openPublisherURL) }

// URL parameters understood by core.OpenSource and core.OpenPublisher for
// sqs:// URLs. Publishers accept only the client ones and id_attribute.
var (
	clientParams = map[string]bool{"endpoint": true, "region": true, "id_attribute": true}
	sourceParams = map[string]bool{
		"dlq": true, "dead_letter_mode": true, "wait": true, "visibility": true, "receivers": true,
		"window": true, "heartbeat": true, "max_extension": true, "close_timeout": true,
	}
)

// parseURL reads
//
//	sqs://QUEUE?region=R&endpoint=http://127.0.0.1:9324&…
//	sqs://ACCESS_KEY:SECRET@QUEUE?endpoint=…           (static credentials, for emulators)
//	sqs://sqs.eu-west-1.amazonaws.com/123456789012/QUEUE  (a queue URL, https)
//
// into the queue and options. Without credentials in the URL the AWS
// credential chain is used.
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
	query, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return "", nil, fmt.Errorf("sqs URL parameters: %w", err)
	}
	keys := make([]string, 0, len(query))
	for k := range query {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := query[k][len(query[k])-1]
		if !clientParams[k] && !(source && sourceParams[k]) {
			known := []string{"endpoint", "region", "id_attribute"}
			if source {
				known = append(known, "dlq", "dead_letter_mode", "wait", "visibility", "receivers", "window", "heartbeat", "max_extension", "close_timeout")
			}
			return "", nil, fmt.Errorf("sqs URL: unknown parameter %q (known: %s)", redact.Name(k), strings.Join(known, ", "))
		}
		var o Option
		switch k {
		case "endpoint":
			o = WithEndpoint(v)
		case "region":
			o = WithRegion(v)
		case "id_attribute":
			o = WithIDAttribute(v)
		case "dlq":
			o = WithDeadLetterQueue(v)
		case "dead_letter_mode":
			switch v {
			case "send":
				o = WithDeadLetterMode(DeadLetterSend)
			case "redrive":
				o = WithDeadLetterMode(DeadLetterRedrive)
			default:
				return "", nil, errors.New("sqs URL parameter dead_letter_mode: not send or redrive")
			}
		case "heartbeat":
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				return "", nil, errors.New("sqs URL parameter heartbeat: not a boolean")
			}
			o = WithHeartbeat(b)
		case "receivers", "window":
			n, perr := strconv.Atoi(v)
			if perr != nil {
				return "", nil, fmt.Errorf("sqs URL parameter %s: not a number", k)
			}
			if k == "receivers" {
				o = WithReceivers(n)
			} else {
				o = WithWindow(n)
			}
		case "wait", "visibility", "max_extension", "close_timeout":
			d, perr := time.ParseDuration(v)
			if perr != nil {
				return "", nil, fmt.Errorf("sqs URL parameter %s: not a duration", k)
			}
			o = map[string]func(time.Duration) Option{
				"wait": WithWaitTime, "visibility": WithVisibilityTimeout,
				"max_extension": WithMaxExtension, "close_timeout": WithCloseTimeout,
			}[k](d)
		}
		opts = append(opts, o)
	}
	return queue, opts, nil
}

func openSourceURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (core.Source, error) {
	queue, opts, err := parseURL(u, true)
	if err != nil {
		return nil, err
	}
	return Open(ctx, queue, opts...)
}

func openPublisherURL(ctx context.Context, u *url.URL, _ driver.OpenConfig) (core.Publisher, error) {
	queue, opts, err := parseURL(u, false)
	if err != nil {
		return nil, err
	}
	return NewPublisher(ctx, queue, opts...)
}
