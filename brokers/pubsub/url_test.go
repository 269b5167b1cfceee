package pubsub

import (
	"context"
	"os"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core"
)

// A URL it cannot take fails before anything is dialled, with an error
// that names the parameter (and the nearest one it knows) or the URL's
// shape: the adapter's own never quotes a value, and through core (which
// shows the URL, redacted) a password in it never shows.
func TestURLErrors(t *testing.T) {
	const secret = "hunter2-secret"
	cases := []struct{ url, want string }{
		{"pubsub://proj", "want pubsub://PROJECT/SUBSCRIPTION?topic=TOPIC"},
		{"pubsub://proj/a/b", "want pubsub://PROJECT/SUBSCRIPTION"},
		{"pubsub://proj:8085/sub", "want pubsub://PROJECT/SUBSCRIPTION"},
		{"pubsub://alice:" + secret + "@proj/sub?topic=t", "without credentials"},
		{"pubsub://proj/sub?topic=%zz" + secret, "a literal % written %25"},
		{"pubsub://proj/sub?tpoic=t", `unknown parameter "tpoic" (did you mean topic?)`},
		{"pubsub://proj/sub?max_deliveries=3", "parameter max_deliveries: Pub/Sub takes 5 to 100"},
		{"pubsub://proj/sub?max_deliveries=" + secret, "parameter max_deliveries: not a number"},
		{"pubsub://proj/sub?declare=" + secret, "parameter declare: not a boolean"},
		{"pubsub://proj/sub?max_extension=" + secret, "parameter max_extension: not a duration"},
		{"pubsub://proj/sub?id_attribute=", "parameter id_attribute: empty"},
	}
	ctx := context.Background()
	for _, c := range cases {
		for what, open := range map[string]func() error{
			"Open":                  func() error { _, err := Open(ctx, c.url); return err },
			"NewPublisher":          func() error { _, err := NewPublisher(ctx, c.url); return err },
			"core.OpenSource":       func() error { _, err := core.OpenSource(ctx, c.url); return err },
			"core.OpenPublisher":    func() error { _, err := core.OpenPublisher(ctx, c.url); return err },
			"admin.OpenDeadLetters": func() error { _, err := admin.OpenDeadLetters(ctx, c.url); return err },
		} {
			err := open()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s(%q) = %v, want an error saying %q", what, c.url, err, c.want)
			} else if strings.Contains(err.Error(), secret) && (!strings.Contains(what, ".") || strings.Contains(c.url, "@")) {
				t.Errorf("%s(%q): the error shows the secret: %v", what, c.url, err)
			}
		}
	}
}

// With declare=false nothing is created: a missing subscription fails,
// named, and stays missing; an operator's dead-letter tool never creates
// one either. A subscription reading another topic than topic= is
// refused.
func TestDeclare(t *testing.T) {
	emulatorHost(t)
	ctx := context.Background()
	name := "missing-" + randomHex(4)
	for what, open := range map[string]func(string) error{
		"Open":                  func(u string) error { _, err := Open(ctx, u); return err },
		"admin.OpenDeadLetters": func(u string) error { _, err := admin.OpenDeadLetters(ctx, u); return err },
	} {
		for _, u := range []string{"pubsub://" + project + "/" + name + "?topic=t-" + name + "&declare=false", "pubsub://" + project + "/" + name + "?topic=t-" + name} {
			if what == "Open" && !strings.Contains(u, "declare=false") {
				continue
			}
			err := open(u)
			if err == nil || !strings.Contains(err.Error(), "subscription projects/"+project+"/subscriptions/"+name) || !strings.Contains(err.Error(), "NotFound") {
				t.Errorf("%s(%s) = %v, want an error naming the missing subscription", what, u, err)
			}
		}
	}
	ts := newTestSub(t, "")
	for _, n := range []string{name, name + "-dlq"} {
		_, err := ts.cl.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: ts.full("subscriptions", n)})
		if status.Code(err) != codes.NotFound {
			t.Errorf("subscription %s: %v, want it never created", n, err)
		}
	}
	if _, err := ts.cl.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: ts.full("topics", "t-"+name)}); status.Code(err) != codes.NotFound {
		t.Errorf("topic t-%s: %v, want it never created", name, err)
	}
	// Without topic= a missing subscription cannot be made.
	if _, err := Open(ctx, "pubsub://"+project+"/"+name); err == nil || !strings.Contains(err.Error(), "with declare=true and topic=") {
		t.Errorf("Open without topic= = %v, want an error saying topic= makes it", err)
	}
	// An existing subscription opens with declare=false, and without topic=.
	for _, u := range []string{ts.url("declare=false"), "pubsub://" + project + "/" + ts.name} {
		s, err := Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%s): %v", u, err)
		}
		s.Close()
	}
	other := "pubsub://" + project + "/" + ts.name + "?topic=elsewhere"
	if _, err := Open(ctx, other); err == nil || !strings.Contains(err.Error(), "reads topic projects/"+project+"/topics/"+ts.topic+", not topic=projects/"+project+"/topics/elsewhere") {
		t.Errorf("Open(%s) = %v, want an error naming both topics", other, err)
	}
	if os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		t.Fatal("PUBSUB_EMULATOR_HOST unset")
	}
}
