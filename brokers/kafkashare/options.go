package kafkashare

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/core/driver/urlparam"
	"github.com/idemq/idemq/internal/option"
	"github.com/idemq/idemq/internal/redact"
)

// Option configures a Source. Options apply in order, after the URL's
// parameters; an invalid one fails Open, named.
type Option func(*config) error

// Start says where a share group begins reading a partition it has not
// read before.
type Start int

const (
	// StartFirst reads each partition from its earliest record. Default.
	StartFirst Start = iota + 1
	// StartLast reads only records produced after the group starts.
	StartLast
	// StartAsIs leaves the group's share.auto.offset.reset as the
	// operator set it (Kafka's default: latest).
	StartAsIs
)

type config struct {
	brokers                []string
	topic, group, idHeader string
	deadLetterTopic        string
	start                  Start
	maxExtension           time.Duration
	window                 int
	offsetID               bool
	logger                 *slog.Logger
	kgoOpts                []kgo.Opt
}

func set(name string, err error, f func(*config)) Option {
	return option.Set("kafkashare", name, err, f)
}

func named(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	return nil
}

// WithGroup names the share group. Required.
func WithGroup(g string) Option { return set("WithGroup", named(g), func(c *config) { c.group = g }) }

// WithIDHeader names the record header holding the business id. Default
// "message-id", as the kafka:// Publisher writes it. A record without it
// is dead-lettered (ErrMissingID), unless WithOffsetID.
func WithIDHeader(h string) Option {
	return set("WithIDHeader", named(h), func(c *config) { c.idHeader = h })
}

// WithOffsetID gives a record without the id header the id
// topic/partition/offset, which is the same on every redelivery of the
// record: for producers that set no id. It does not catch a record a
// producer sent twice (two offsets); and reset or recreated topics reuse
// offsets, which would then be decided Duplicate. Default off: such a
// record is dead-lettered.
func WithOffsetID() Option { return offsetID(true) }

func offsetID(on bool) Option { return set("WithOffsetID", nil, func(c *config) { c.offsetID = on }) }

// WithDeadLetterTopic names the topic a parked record's copy is produced
// to, with the cause in its headers, before the record is rejected.
// Default "<topic>.dlq".
func WithDeadLetterTopic(t string) Option {
	return set("WithDeadLetterTopic", named(t), func(c *config) { c.deadLetterTopic = t })
}

// WithStart sets the group's share.auto.offset.reset at Open: where it
// begins reading a partition it has no position on yet. Default
// StartFirst.
func WithStart(s Start) Option {
	return set("WithStart", option.Range(s, StartFirst, StartAsIs), func(c *config) { c.start = s })
}

// WithMaxExtension caps how long after its delivery a record's lock is
// renewed (RENEW) while its handler runs; past it the lock lapses and the
// broker delivers the record again. Default 1h.
func WithMaxExtension(d time.Duration) Option {
	return set("WithMaxExtension", option.Positive(d), func(c *config) { c.maxExtension = d })
}

// WithWindow bounds the records one poll acquires, and so the records the
// Source holds locked. The Consumer's window overrides it. Default 100.
func WithWindow(n int) Option {
	return set("WithWindow", option.Positive(n), func(c *config) { c.window = n })
}

// WithLogger sets the logger for lock renewals and acknowledgements that
// failed. Default: the Consumer's.
func WithLogger(l *slog.Logger) Option {
	return set("WithLogger", option.NotNil(l != nil, "logger"), func(c *config) { c.logger = l })
}

// WithClientOptions adds franz-go client options, after the Source's own:
// TLS (kgo.DialTLSConfig), SASL (kgo.SASL), client id, fetch sizes. Options
// that change the consuming mode (kgo.ConsumerGroup, kgo.ConsumePartitions)
// break the Source.
func WithClientOptions(opts ...kgo.Opt) Option {
	return set("WithClientOptions", option.NoneNil(opts, "option"), func(c *config) { c.kgoOpts = append(c.kgoOpts, opts...) })
}

var params = urlparam.Table[Option]{Scheme: Scheme, Params: map[string]urlparam.Param[Option]{
	"group":             urlparam.Text("WithGroup", WithGroup),
	"id_header":         urlparam.Text("WithIDHeader", WithIDHeader),
	"dead_letter_topic": urlparam.Text("WithDeadLetterTopic", WithDeadLetterTopic),
	"start":             urlparam.Choice("WithStart", map[string]Option{"first": WithStart(StartFirst), "last": WithStart(StartLast), "as-is": WithStart(StartAsIs)}),
	"max_extension":     urlparam.Duration("WithMaxExtension", WithMaxExtension),
	"window":            urlparam.Int("WithWindow", WithWindow),
	"offset_id":         urlparam.Bool("WithOffsetID", offsetID),
}}

// resolve reads the URL raw and applies opts after its parameters.
func resolve(raw string, opts []Option) (config, error) {
	c := config{idHeader: "message-id", start: StartFirst, maxExtension: time.Hour, window: 100}
	u, err := redact.ParseURL(raw)
	if err != nil {
		return c, fmt.Errorf("kafka+share URL: %w", err)
	}
	c.topic = strings.Trim(u.Path, "/")
	if u.Scheme != Scheme || u.Host == "" || c.topic == "" || strings.Contains(c.topic, "/") {
		return c, errors.New("kafka+share URL needs the scheme kafka+share://, the brokers and the topic as its path (kafka+share://host:9092[,host:9092]/TOPIC?group=G)")
	}
	if u.User != nil {
		return c, errors.New("kafka+share URL: credentials are not read from the URL; give TLS and SASL with WithClientOptions")
	}
	for _, h := range strings.Split(u.Host, ",") {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return c, fmt.Errorf("kafka+share URL: broker %q: want host:port", redact.URL(h))
		}
		c.brokers = append(c.brokers, h)
	}
	q, err := redact.ParseQuery(u.RawQuery)
	if err != nil {
		return c, fmt.Errorf("kafka+share URL parameters: %w", err)
	}
	fromURL, err := params.Read(q)
	if err == nil {
		err = params.Explain(option.Apply(&c, fromURL...))
	}
	if err == nil {
		err = option.Apply(&c, opts...)
	}
	switch {
	case err != nil:
	case c.group == "":
		err = errors.New("kafkashare: a share group is required (WithGroup, or group= in the URL)")
	case c.deadLetterTopic == c.topic:
		err = errors.New("kafkashare: the dead-letter topic is the topic itself")
	}
	if c.deadLetterTopic == "" {
		c.deadLetterTopic = c.topic + ".dlq"
	}
	return c, err
}
