package webhook

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core/driver/attempts"
	"github.com/idemq/idemq/core/driver/option"
)

// DefaultMaxBody is the largest request body a Source reads unless
// WithMaxBody sets another bound: 1 MiB, ample for ordinary events. GitHub
// caps its payloads at 25 MB (a large push), so an endpoint that must take
// every GitHub event raises it.
const DefaultMaxBody = 1 << 20

// DefaultWait is how long a request waits, unless WithWait sets another
// bound, for room in the Consumer's window (back-pressure) or for an
// earlier copy of the same event to settle: 4 s, below the shortest
// timeout of the common senders (Shopify waits 5 s for an answer, GitHub
// 10 s), so the sender reads the 409 or 503 instead of timing out.
const DefaultWait = 4 * time.Second

// DefaultAnswerBy is how long after its arrival a request is answered at
// the latest, unless WithAnswerBy sets another bound: 4.5 s, below
// Shopify's 5 s.
const DefaultAnswerBy = 4500 * time.Millisecond

// Default redelivery horizons, by profile name: how long after the first
// request the provider's automatic retries can still send the event.
var defaultHorizons = map[string]time.Duration{
	"standard": 28 * time.Hour, // retries after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: 27 h 35 min
	"stripe":   72 * time.Hour, // retries in live mode for up to three days
	"github":   72 * time.Hour, // no retries, but redelivery on request for three days
	"shopify":  4 * time.Hour,  // 8 retries over 4 hours
}

// Option configures a Source. Options apply in order; an invalid value
// makes NewSource or Open fail naming the option (or, opened by URL, the
// parameter).
type Option func(*config) error

type config struct {
	profile  signature.Profile
	parkDir  string
	maxBody  int64
	wait     time.Duration
	answerBy time.Duration
	horizon  time.Duration // 0: the profile's default
	logger   *slog.Logger
	now      func() time.Time
}

func set(name string, err error, f func(*config)) Option {
	return option.Set("webhook", name, err, f)
}

// WithProfile sets how requests are verified: a signature.Profile, from
// signature.Open or a provider's constructor. Required.
func WithProfile(p signature.Profile) Option {
	return set("WithProfile", option.Present(p), func(c *config) { c.profile = p })
}

// WithParkDir names the directory parked requests are written to, one JSON
// file each (see ParkedRequest). Required; it must exist and be writable,
// which NewSource checks, naming the path when it is not.
func WithParkDir(dir string) Option {
	return set("WithParkDir", option.Refuse(dir == "", "empty"), func(c *config) { c.parkDir = dir })
}

// WithMaxBody bounds the request body in bytes; a longer one is answered
// 413 without being read further. Default DefaultMaxBody.
func WithMaxBody(n int64) Option {
	return set("WithMaxBody", option.Positive(n), func(c *config) { c.maxBody = n })
}

// WithWait bounds how long a request waits for room in the Consumer's
// window (or for the Consumer to start), or for the settlement of an
// earlier copy of its event, before it is answered 503 or 409, with
// Retry-After the same. Default DefaultWait.
func WithWait(d time.Duration) Option {
	return set("WithWait", option.Positive(d), func(c *config) { c.wait = d })
}

// WithAnswerBy bounds how long after its arrival a request given to the
// Consumer waits for its own settlement: past it, the request is answered
// 503 with Retry-After while the Consumer goes on with it, so a sender
// whose timeout is shorter than the handler reads an answer rather than
// timing out. The effect still commits once; the sender's next copy waits
// for that settlement (WithWait) or, once it is done, is answered 200 as a
// Duplicate. Keep it below the sender's timeout (Shopify 5 s, GitHub 10 s).
// Default DefaultAnswerBy.
func WithAnswerBy(d time.Duration) Option {
	return set("WithAnswerBy", option.Positive(d), func(c *config) { c.answerBy = d })
}

// WithHorizon sets the redelivery horizon the Source reports to the
// Consumer (driver.RedeliveryHorizoner): the longest time after which the
// provider can still send an event again. The Consumer warns at start-up
// (or, with core.WithStrictRetention, refuses to start) when the store
// keeps claims for less, since a copy arriving after its claim was pruned
// would apply the effect twice. Default the profile's automatic retry
// window: standard 28 h, stripe 72 h, github 72 h (redelivery on request),
// shopify 4 h, none for a profile of your own. Raise it to cover resends
// asked for in the provider's dashboard later than that.
func WithHorizon(d time.Duration) Option {
	return set("WithHorizon", option.Positive(d), func(c *config) { c.horizon = d })
}

// WithLogger sets the logger. Default the Consumer's, else slog.Default().
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.Present(l), func(c *config) { c.logger = l })
}

// build returns the Source of the URL's options, then opts, over the
// defaults, once it checked what is required; explain rewords an option's
// error as its URL parameter.
func build(fromURL, opts []Option, explain func(error) error) (*Source, error) {
	c := config{maxBody: DefaultMaxBody, wait: DefaultWait, answerBy: DefaultAnswerBy, now: time.Now}
	err := explain(option.Apply(&c, fromURL...))
	if err == nil {
		err = option.Apply(&c, opts...)
	}
	if err == nil && c.profile == nil {
		err = option.Errorf("webhook", "WithProfile", "required: the signature profile requests are verified with")
	}
	if err == nil {
		err = explain(checkDir(c.parkDir))
	}
	if err != nil {
		return nil, err
	}
	s := &Source{c: c, attempts: attempts.New[string](maxRemembered), serving: make(chan struct{}),
		done: make(chan struct{}), flights: map[string]*request{}}
	s.logger.Store(c.logger)
	return s, nil
}

// checkDir checks that dir (WithParkDir's) is given and is a directory a
// file can be written to; its error names dir, which is no secret and
// which the operator must create or fix.
func checkDir(dir string) error {
	if dir == "" {
		return option.Errorf("webhook", "WithParkDir", "required: the directory parked requests are written to")
	}
	fi, err := os.Stat(dir)
	if err == nil && !fi.IsDir() {
		err = fmt.Errorf("not a directory: %s", dir)
	}
	var f *os.File
	if err == nil {
		f, err = os.CreateTemp(dir, ".idemq-check-*")
	}
	if err == nil {
		err = errors.Join(f.Close(), os.Remove(f.Name()))
	}
	if err != nil {
		return option.Errorf("webhook", "WithParkDir", "%w", err)
	}
	return nil
}
