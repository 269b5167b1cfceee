package sqs

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/redact/redacttest"
)

// FuzzParseURL: parseURL never panics, quotes no secret in an error (the
// secret key, an endpoint's password), and static credentials in the URL
// reach the options intact.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"sqs://orders?region=eu-west-1",
		"sqs://AKIDEXAMPLE:wJalrXUtnFEMI%2FK7MDENG@orders?endpoint=http://127.0.0.1:9324&region=us-east-1&id_attribute=message-id",
		"sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo?dlq=orders-dlq.fifo&dead_letter_mode=send&wait=20s&visibility=30s&receivers=2&window=20&heartbeat=true&max_extension=1h&close_timeout=5s",
		"sqs://KEY@orders", "sqs://K:S@?x=1", "sqs://q?wait=forever", "sqs://q?receivers=-1&window=0",
		"sqs://q?endpoint=http://u:s3cretpw@h:bad",
	} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, raw string, source bool) {
		redacttest.NoSecret(t, raw, func(raw string) error {
			u, err := redact.ParseURL(raw)
			if err != nil {
				return err
			}
			_, opts, err := parseURL(u, source)
			if err != nil {
				return err
			}
			cfg := defaultConfig()
			for _, o := range opts {
				if err := o.apply(&cfg); err != nil {
					return err
				}
			}
			return nil
		})
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		queue, opts, err := parseURL(u, source)
		if err != nil {
			return
		}
		if queue == "" {
			t.Fatalf("accepted %q without a queue", raw)
		}
		cfg := defaultConfig()
		for _, o := range opts {
			if o.apply(&cfg) != nil {
				return
			}
		}
		if secret, ok := u.User.Password(); ok {
			creds, err := cfg.credentials.Retrieve(context.Background())
			if err != nil || creds.AccessKeyID != u.User.Username() || creds.SecretAccessKey != secret {
				t.Fatalf("credentials of %q reach the client as %q/%q (%v)", raw, creds.AccessKeyID, creds.SecretAccessKey, err)
			}
		}
	})
}

// FuzzNewDelivery is the id extraction of this adapter: the business id
// is the id attribute's string value exactly (binary values as bytes),
// the receive count never gives an attempt below 1, and a body marked
// base64 that does not decode is kept as received.
func FuzzNewDelivery(f *testing.F) {
	f.Add("pay-1", "3", "hello", false, []byte(nil))
	f.Add("a\x00\xff", "-7", "!!not base64", true, []byte{0, 1})
	f.Add("", "99999999999999999999", "aGVsbG8=", true, []byte("bin-id"))
	f.Fuzz(func(t *testing.T, id, count, body string, base64Body bool, binID []byte) {
		s := &Source{q: &queueInfo{name: "q", url: "http://127.0.0.1/q"}, cfg: defaultConfig(), vis: 30 * time.Second}
		attrs := map[string]types.MessageAttributeValue{
			"traceparent": {DataType: aws.String("String"), StringValue: aws.String(body)},
		}
		want := id
		if binID != nil {
			attrs[s.cfg.idAttribute] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: binID}
			want = string(binID)
		} else {
			attrs[s.cfg.idAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(id)}
		}
		if base64Body {
			attrs[AttributeEncoding] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String("base64")}
		}
		m := &types.Message{
			Body:              aws.String(body),
			MessageId:         aws.String("sqs-id"),
			ReceiptHandle:     aws.String("rh"),
			Attributes:        map[string]string{"ApproximateReceiveCount": count, "MessageGroupId": id},
			MessageAttributes: attrs,
		}
		msg := &s.newDelivery(m, time.Now()).msg
		if msg.ID != want {
			t.Fatalf("id %q became %q", want, msg.ID)
		}
		if msg.Attempt < 1 {
			t.Fatalf("attempt %d from receive count %q", msg.Attempt, count)
		}
		if !base64Body && string(msg.Body) != body {
			t.Fatalf("body changed")
		}
	})
}

// id_header, the parameter core's missing-id causes name on every broker,
// is id_attribute on SQS.
func TestIDHeaderIsIDAttribute(t *testing.T) {
	u, err := url.Parse("sqs://orders?region=us-east-1&id_header=MessageId")
	if err != nil {
		t.Fatal(err)
	}
	_, opts, err := parseURL(u, true)
	if err != nil {
		t.Fatal(err)
	}
	c := defaultConfig()
	for _, o := range opts {
		if err := o.apply(&c); err != nil {
			t.Fatal(err)
		}
	}
	if c.idAttribute != "MessageId" {
		t.Errorf("id_header=MessageId set the id attribute to %q", c.idAttribute)
	}
}
