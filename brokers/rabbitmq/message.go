package rabbitmq

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"reflect"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemq/idemq/core/driver"
)

// delivery is one received message bound to its session: its Message's
// AckID.
type delivery struct {
	sess *session
	raw  amqp.Delivery
	msg  driver.Message
	id   string // the id as the Source read it, before any IDFunc
}

// MetadataRedelivered is the Message.Metadata key of the AMQP redelivered
// flag (a boolean), which the OpenTelemetry conventions have no
// attribute for.
const MetadataRedelivered = "messaging.rabbitmq.message.redelivered_flag"

// toMessage converts an AMQP delivery into m, the pipeline's Message, its
// id read per idHeader (see WithIDHeader), or IDError saying why there is
// none.
func toMessage(m *driver.Message, queue, idHeader string, r *amqp.Delivery) {
	id, idErr := messageID(idHeader, r)
	key, _ := r.Headers[KeyHeader].(string)
	*m = driver.Message{
		ID:         id,
		IDError:    idErr,
		Body:       r.Body,
		Key:        key,
		Headers:    renderHeaders(r.Headers),
		Source:     queue,
		System:     "rabbitmq",
		Attempt:    attempt(r),
		ReceivedAt: time.Now(),
	}
}

// metadata is a delivery's Message.Metadata, read from it when asked.
type metadata delivery

// All yields the destination (the exchange), routing key, delivery tag,
// message and correlation ids and the redelivered flag.
func (m *metadata) All() iter.Seq2[string, slog.Value] {
	return func(yield func(string, slog.Value) bool) {
		r := &m.raw
		_ = yield(string(semconv.MessagingDestinationNameKey), slog.StringValue(cmp.Or(r.Exchange, "amq.default"))) &&
			yield(string(semconv.MessagingRabbitMQDestinationRoutingKeyKey), slog.StringValue(r.RoutingKey)) &&
			yield(string(semconv.MessagingRabbitMQMessageDeliveryTagKey), slog.Uint64Value(r.DeliveryTag)) &&
			yield(string(semconv.MessagingMessageIDKey), slog.StringValue(m.id)) &&
			yield(string(semconv.MessagingMessageConversationIDKey), slog.StringValue(r.CorrelationId)) &&
			yield(MetadataRedelivered, slog.BoolValue(r.Redelivered))
	}
}

// messageID reads the business id from the idHeader when the message has
// it, else from message_id; without either, the error says where it looked.
func messageID(idHeader string, r *amqp.Delivery) (string, error) {
	v, ok := r.Headers[idHeader]
	if idHeader == "" || !ok {
		switch {
		case r.MessageId != "":
			return r.MessageId, nil
		case idHeader != "":
			return "", fmt.Errorf("rabbitmq: no header %q and no message_id property", idHeader)
		}
		return "", errors.New("rabbitmq: no message_id property")
	}
	if text, ok := headerText(v); ok {
		return text, nil
	}
	return "", fmt.Errorf("rabbitmq: id header %q holds a %T, not a string, byte array or integer", idHeader, v)
}

// attempt derives the delivery attempt: 2 when the broker flags a
// redelivery, x-delivery-count+1 on quorum queues, or the AttemptHeader of
// a RetryViaQueue copy (plus one if it was redelivered).
func attempt(r *amqp.Delivery) int {
	a := 1
	if r.Redelivered {
		a = 2
	}
	if n, ok := toInt(r.Headers["x-delivery-count"]); ok && n+1 > a {
		a = n + 1
	}
	if n, ok := toInt(r.Headers[driver.AttemptHeader]); ok {
		if r.Redelivered {
			n++
		}
		a = max(a, n)
	}
	return a
}

// toInt reads an AMQP integer, or a string holding one.
func toInt(v any) (int, bool) {
	switch x := v.(type) {
	case nil, []byte: // an absent header costs no parse error
		return 0, false
	case int64:
		return int(x), true
	}
	text, ok := headerText(v)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(text)
	return n, err == nil
}

// headerText renders an AMQP string, byte array or integer (any width,
// signed or not) as text, integers in decimal with strconv: fmt.Sprint
// costs several times as much, on every message with a numeric header.
func headerText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case int64: // what amqp091-go decodes a long long into (timestamps, counts): no reflection
		return strconv.FormatInt(x, 10), true
	case int32:
		return strconv.FormatInt(int64(x), 10), true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(r.Int(), 10), true
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(r.Uint(), 10), true
	}
	return "", false
}

// renderHeaders renders AMQP header values as strings: text and byte
// arrays as they are, numbers and booleans in decimal, times in RFC 3339,
// nested tables and arrays with fmt.
func renderHeaders(t amqp.Table) map[string]string {
	h := make(map[string]string, len(t))
	for k, v := range t {
		text, ok := headerText(v)
		switch x := v.(type) {
		case time.Time:
			text = x.UTC().Format(time.RFC3339)
		case nil:
			text = ""
		case bool:
			text = strconv.FormatBool(x)
		default:
			if !ok {
				text = fmt.Sprint(x)
			}
		}
		h[k] = text
	}
	return h
}
