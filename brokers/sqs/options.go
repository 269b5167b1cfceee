package sqs

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemq/idemq/core/driver/option"
	"github.com/idemq/idemq/core/driver/urlparam"
)

// DeadLetterMode chooses how Source.DeadLetter parks a message.
type DeadLetterMode int

const (
	// DeadLetterSend sends a copy with the cause to the dead-letter queue
	// (WithDeadLetterQueue's, else the redrive policy's target), then
	// deletes the original: a failed send keeps it, a failed delete after
	// the send may leave a second copy.
	DeadLetterSend DeadLetterMode = iota + 1
	// DeadLetterRedrive makes the message visible again at once and leaves
	// parking to the queue's redrive policy, which moves it when its
	// receive count passes maxReceiveCount; until then every receive runs
	// it again. The cause is only logged. Open fails without a policy.
	DeadLetterRedrive
)

// Option configures a Source or DeadLetters. Options apply in order, after
// the address's URL parameters, which they override; an invalid value makes
// the constructor fail naming the option.
type Option interface{ apply(*config) error }

// PublisherOption configures a Publisher: the ClientOptions.
type PublisherOption interface {
	Option
	publisherOption()
}

// ClientOption is an option a Source, a Publisher and DeadLetters all
// take: how to reach SQS, the id attribute and the settle retries.
type ClientOption func(*config) error

func (o ClientOption) apply(c *config) error { return o(c) }
func (ClientOption) publisherOption()        {}

// sourceOption is an option of a Source and DeadLetters alone.
type sourceOption func(*config) error

func (o sourceOption) apply(c *config) error { return o(c) }

// config holds every setting; a Publisher reads the ClientOptions'.
type config struct {
	clientConfig
	receivers, settleRetries             int // receivers 0: from the Consumer's window
	waitTime, maxExtension, closeTimeout time.Duration
	visibility                           time.Duration // 0: DefaultVisibilityTimeout, or the queue's (see WithVisibilityTimeout)
	heartbeat, releaseOnClose            bool
	idAttribute, deadLetterQueue         string
	deadLetterMode                       DeadLetterMode
	logger                               *slog.Logger // nil: the Consumer's, else slog.Default()
	byURL                                bool         // errors name URL parameters
}

// clientConfig is how to reach SQS.
type clientConfig struct {
	client           *awssqs.Client
	awsConfig        *aws.Config
	endpoint, region string
	credentials      aws.CredentialsProvider
}

func defaultConfig() config {
	return config{settleRetries: 3, waitTime: 20 * time.Second, maxExtension: time.Hour, closeTimeout: 20 * time.Second,
		heartbeat: true, releaseOnClose: true, idAttribute: DefaultIDAttribute, deadLetterMode: DeadLetterSend}
}

// optErr reports a configuration problem by what the user wrote: the
// option, or the URL parameter (or part) that set it.
func (c *config) optErr(name, format string, args ...any) error {
	err := option.Errorf("sqs", name, format, args...)
	switch {
	case !c.byURL:
		return err
	case name == "WithStaticCredentials":
		return fmt.Errorf("sqs URL parameter credentials (sqs://KEY:SECRET@queue): %w", errors.Unwrap(err))
	}
	return urlParams.Explain(err)
}

// spell returns goForm, or urlForm when the configuration came from a URL.
func (c *config) spell(goForm, urlForm string) string {
	if c.byURL {
		return urlForm
	}
	return goForm
}

// checked is the option named name that applies set, or fails with the
// problem (format and args) when bad.
func checked(name string, bad bool, set func(*config), format string, args ...any) func(*config) error {
	return func(c *config) error {
		if bad {
			return c.optErr(name, format, args...)
		}
		set(c)
		return nil
	}
}

// Settle retries (WithSettleRetries) pause from settlePause, doubling.
const (
	settlePause      = 50 * time.Millisecond
	maxSettleRetries = 10
)

// WithReceivers sets how many long polls the Consumer keeps outstanding at
// once, each a ReceiveMessage call asking for up to 10 messages. Default
// one per ten messages of the Consumer's window, at least 2; 1..64.
func WithReceivers(n int) Option {
	return sourceOption(checked("WithReceivers", n < 1 || n > 64, func(c *config) { c.receivers = n }, "%d is outside 1..64", n))
}

// WithWaitTime sets each ReceiveMessage call's long-polling wait. Default
// 20s, the maximum; 0..20s in whole seconds (0 is short polling).
func WithWaitTime(d time.Duration) Option {
	return sourceOption(checked("WithWaitTime", d < 0 || d > 20*time.Second || d%time.Second != 0, func(c *config) { c.waitTime = d }, "%v is not a whole number of seconds in 0..20s", d))
}

// DefaultVisibilityTimeout is the visibility timeout each receive asks for
// while the heartbeat runs, unless the queue's VisibilityTimeout is
// shorter or WithVisibilityTimeout sets one: the heartbeat keeps a live
// consumer's messages hidden however long it works on them, so the
// visibility timeout bounds only how long a crashed consumer's messages
// stay hidden.
const DefaultVisibilityTimeout = 6 * time.Second

// WithVisibilityTimeout sets the visibility timeout each receive asks for,
// the lease the Consumer's heartbeat renews (Extend). Default DefaultVisibilityTimeout, or the
// queue's VisibilityTimeout when that is shorter; with WithHeartbeat(false)
// the queue's. 1s..12h in whole seconds.
func WithVisibilityTimeout(d time.Duration) Option {
	return sourceOption(checked("WithVisibilityTimeout", d < time.Second || d > 12*time.Hour || d%time.Second != 0, func(c *config) { c.visibility = d }, "%v is not a whole number of seconds in 1s..12h", d))
}

// WithHeartbeat turns on or off the Consumer's heartbeat, which extends an
// unsettled message's visibility (every third of the visibility timeout)
// before it lapses, up to WithMaxExtension. Default on; off, nothing
// extends it, so the Source asks for the queue's own visibility timeout,
// and a handler slower than that lets another consumer receive the
// message (the dedup key still applies it once).
func WithHeartbeat(on bool) Option {
	return sourceOption(func(c *config) error { c.heartbeat = on; return nil })
}

// WithMaxExtension caps how long after its receipt the heartbeat keeps a
// message hidden: the visibility lapses by then (up to a second later, SQS
// counting whole seconds). A FIFO message held back behind its group's
// counts from when it is handed out. Default 1h, 1s..12h.
func WithMaxExtension(d time.Duration) Option {
	return sourceOption(checked("WithMaxExtension", d < time.Second || d > 12*time.Hour, func(c *config) { c.maxExtension = d }, "%v is outside 1s..12h", d))
}

// WithDeadLetterQueue names the queue (URL or name) DeadLetterSend sends to.
// Default the redrive policy's target; Open fails without either.
func WithDeadLetterQueue(urlOrName string) Option {
	return sourceOption(checked("WithDeadLetterQueue", urlOrName == "", func(c *config) { c.deadLetterQueue = urlOrName }, "empty queue"))
}

// WithDeadLetterMode chooses how DeadLetter parks a message. Default
// DeadLetterSend.
func WithDeadLetterMode(m DeadLetterMode) Option {
	return sourceOption(checked("WithDeadLetterMode", m != DeadLetterSend && m != DeadLetterRedrive, func(c *config) { c.deadLetterMode = m }, "unknown mode %d", m))
}

// WithReleaseOnClose chooses whether the messages the Consumer gives back
// when it stops (Release), and those the Source received that the Consumer
// never got, become visible again at once rather than after their
// visibility timeout. Default true.
func WithReleaseOnClose(release bool) Option {
	return sourceOption(func(c *config) error { c.releaseOnClose = release; return nil })
}

// WithCloseTimeout bounds how long Close waits for long polls in progress,
// so that what SQS hands them is made visible again rather than stranded
// until its visibility timeout. Default 20s; 0 cancels them at once. Must be 0..1m.
func WithCloseTimeout(d time.Duration) Option {
	return sourceOption(checked("WithCloseTimeout", d < 0 || d > time.Minute, func(c *config) { c.closeTimeout = d }, "%v is outside 0..1m", d))
}

// WithLogger sets the logger of warnings. Default the one given to
// core.OpenSource, else the Consumer's, else slog.Default().
func WithLogger(l *slog.Logger) Option {
	return sourceOption(checked("WithLogger", l == nil, func(c *config) { c.logger = l }, "nil logger"))
}

// WithIDAttribute names the message attribute that holds the business id,
// which Publisher sets. Default DefaultIDAttribute. A message without it
// has an empty ID (core.WithIDFunc may derive one).
func WithIDAttribute(name string) ClientOption {
	err := checkAttributeName(name)
	return checked("WithIDAttribute", err != nil, func(c *config) { c.idAttribute = name }, "%v", err)
}

// WithSettleRetries sets how many more times a failed batch entry (a
// delete, visibility change or send) is sent, with a short backoff, before
// the failure is reported. Default 3, 0..10.
func WithSettleRetries(n int) ClientOption {
	return checked("WithSettleRetries", n < 0 || n > maxSettleRetries, func(c *config) { c.settleRetries = n }, "%d is outside 0..%d", n, maxSettleRetries)
}

// WithClient uses an existing SQS client instead of building one from the
// AWS default configuration and the other client options.
func WithClient(cl *awssqs.Client) ClientOption {
	return checked("WithClient", cl == nil, func(c *config) { c.client = cl }, "nil client")
}

// WithAWSConfig builds the client from cfg instead of the AWS default
// configuration. Default: config.LoadDefaultConfig.
func WithAWSConfig(cfg aws.Config) ClientOption {
	return func(c *config) error { c.awsConfig = &cfg; return nil }
}

// WithEndpoint sends every request to endpoint (an emulator at
// http://127.0.0.1:9324, say) instead of the region's. With an endpoint
// and no region configured anywhere, the region is us-east-1.
func WithEndpoint(endpoint string) ClientOption {
	// The endpoint is not quoted: it may carry credentials.
	u, err := urlparam.ParseURL(endpoint)
	if err == nil && ((u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		err = errors.New("not an http:// or https:// URL with a host")
	}
	return checked("WithEndpoint", err != nil, func(c *config) { c.endpoint = endpoint }, "%v", err)
}

// WithRegion sets the AWS region. Default the AWS configuration's.
func WithRegion(region string) ClientOption {
	return checked("WithRegion", region == "", func(c *config) { c.region = region }, "empty region")
}

// WithStaticCredentials signs requests with fixed credentials, as
// emulators expect. Default the AWS credential chain.
func WithStaticCredentials(accessKeyID, secretAccessKey, sessionToken string) ClientOption {
	return checked("WithStaticCredentials", accessKeyID == "" || secretAccessKey == "", func(c *config) {
		c.credentials = credentials.NewStaticCredentialsProvider(accessKeyID, secretAccessKey, sessionToken)
	}, "empty access key id or secret")
}

// checkAttributeName validates an SQS message attribute name: 1..256
// characters of A-Z a-z 0-9 _ - ., not starting or ending with a period.
func checkAttributeName(name string) error {
	if name == "" || len(name) > 256 {
		return fmt.Errorf("attribute name of %d characters: 1..256 are allowed", len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("attribute name holds %q (allowed: letters, digits, _ - .)", r)
		}
	}
	if name[0] == '.' || name[len(name)-1] == '.' {
		return errors.New("attribute name must not start or end with a period")
	}
	return nil
}
