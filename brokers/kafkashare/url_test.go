package kafkashare

import (
	"context"
	"strings"
	"testing"
)

// A bad URL or option fails Open before any connection, naming what the
// user wrote.
func TestURLErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"kafka://127.0.0.1:1/t?group=g", "kafka+share://"},
		{"kafka+share://127.0.0.1:1/?group=g", "topic as its path"},
		{"kafka+share://127.0.0.1:1/t", "share group is required"},
		{"kafka+share://127.0.0.1:1/t?group=g&windw=5", "windw"},
		{"kafka+share://127.0.0.1:1/t?group=g&window=0", "window"},
		{"kafka+share://127.0.0.1:1/t?group=g&max_extension=soon", "max_extension"},
		{"kafka+share://127.0.0.1:1/t?group=g&start=middle", "start"},
		{"kafka+share://127.0.0.1:1/t?group=g&dead_letter_topic=t", "dead-letter topic is the topic"},
		{"kafka+share://u:Secr3t@127.0.0.1:1/t?group=g", "WithClientOptions"},
		{"kafka+share://127.0.0.1/t?group=g", "host:port"},
	} {
		_, err := Open(context.Background(), c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "Secr3t") {
			t.Errorf("%s: the error shows the password: %v", c.url, err)
		}
	}
	c, err := resolve("kafka+share://127.0.0.1:1,127.0.0.1:2/t?group=g&window=7&offset_id=true&start=as-is", []Option{WithIDHeader("ce_id")})
	if err != nil || len(c.brokers) != 2 || c.window != 7 || !c.offsetID || c.start != StartAsIs || c.idHeader != "ce_id" || c.deadLetterTopic != "t.dlq" {
		t.Errorf("resolve: %+v, %v", c, err)
	}
}
