package servicetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatal and Skip instead of acting
// on them; like the real ones, they end the calling goroutine.
type recorder struct {
	testing.TB
	fatal, skipped bool
	msg            string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) { r.fatal, r.msg = true, fmt.Sprint(args...); runtime.Goexit() }

func (r *recorder) Fatalf(format string, args ...any) { r.Fatal(fmt.Sprintf(format, args...)) }

func (r *recorder) FailNow() { r.Fatal("FailNow") }

func (r *recorder) Skip(args ...any) { r.skipped, r.msg = true, fmt.Sprint(args...); runtime.Goexit() }

func (r *recorder) Skipf(format string, args ...any) { r.Skip(fmt.Sprintf(format, args...)) }

func (r *recorder) SkipNow() { r.Skip("SkipNow") }

// record runs f on a recorder in a goroutine of its own (Fatal and Skip
// end it) and returns the recorder and what f returned, if it returned.
func record(t *testing.T, f func(testing.TB) string) (*recorder, string) {
	r := &recorder{TB: t}
	var got string
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = f(r)
	}()
	<-done
	return r, got
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		require   string
		wantFatal bool
	}{{"", false}, {"0", false}, {"1", true}} {
		t.Run("require="+tc.require, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.require)
			r, _ := record(t, func(tb testing.TB) string {
				Unavailable(tb, "no %s; set %s", "widget", "IDEMQ_WIDGET_URL")
				return "returned"
			})
			if r.fatal != tc.wantFatal || r.skipped == tc.wantFatal {
				t.Fatalf("fatal=%v skipped=%v, want fatal=%v", r.fatal, r.skipped, tc.wantFatal)
			}
			if !strings.Contains(r.msg, "no widget; set IDEMQ_WIDGET_URL") {
				t.Errorf("message %q lost the caller's text", r.msg)
			}
			if tc.wantFatal && !strings.Contains(r.msg, RequireEnv) {
				t.Errorf("failure %q does not say %s made it one", r.msg, RequireEnv)
			}
		})
	}
}

// Under a real *testing.T, an unreachable service skips the subtest.
func TestUnreachableSkipsRealT(t *testing.T) {
	t.Setenv(RequireEnv, "")
	t.Setenv(PostgresEnv, "postgres://postgres@"+closedPort(t)+"/test?connect_timeout=2")
	var sub *testing.T
	returned := false
	t.Run("postgres", func(t *testing.T) {
		sub = t
		PostgresURL(t)
		returned = true
	})
	if !sub.Skipped() || sub.Failed() || returned {
		t.Fatalf("skipped=%v failed=%v returned=%v, want a skip", sub.Skipped(), sub.Failed(), returned)
	}
}

// Every helper, pointed at a closed port: a skip naming its variable, or a
// failure with IDEMQ_REQUIRE_SERVICES=1; the password never shows.
func TestUnreachable(t *testing.T) {
	const secret = "S3cretPW-servicetest"
	for _, tc := range []struct {
		name, env, value string
		f                func(testing.TB) string
	}{
		{"postgres", PostgresEnv, "postgres://postgres:" + secret + "@%s/test?connect_timeout=2", PostgresURL},
		{"mysql-dsn", MySQLEnv, "root:" + secret + "@tcp(%s)/test", MySQLURL},
		{"mysql-url", MySQLEnv, "mysql://root:" + secret + "@%s/test?table=x&timeout=2s", MySQLURL},
		{"rabbitmq", RabbitMQEnv, "amqp://guest:" + secret + "@%s/", RabbitMQURL},
	} {
		for _, require := range []string{"", "1"} {
			t.Run(tc.name+"/require="+require, func(t *testing.T) {
				t.Setenv(RequireEnv, require)
				t.Setenv(tc.env, fmt.Sprintf(tc.value, closedPort(t)))
				r, got := record(t, tc.f)
				if got != "" {
					t.Fatalf("returned %q for a closed port", got)
				}
				if r.fatal != (require == "1") || r.skipped != (require != "1") {
					t.Fatalf("fatal=%v skipped=%v with %s=%q", r.fatal, r.skipped, RequireEnv, require)
				}
				if !strings.Contains(r.msg, "set "+tc.env) {
					t.Errorf("message %q does not say to set %s", r.msg, tc.env)
				}
				if strings.Contains(r.msg, secret) {
					t.Errorf("message %q shows the password", r.msg)
				}
				t.Log(r.msg)
			})
		}
	}
}

// The local services: each helper returns the URL it checked, and the URL
// works. Under IDEMQ_REQUIRE_SERVICES=1 a missing service fails here.
func TestReachable(t *testing.T) {
	for _, tc := range []struct {
		name, env, def string
		f              func(testing.TB) string
		ping           func(context.Context, string) error
	}{
		{"postgres", PostgresEnv, PostgresDefault, PostgresURL, PingPostgres},
		{"mysql", MySQLEnv, MySQLDefault, MySQLURL, PingMySQL},
		{"rabbitmq", RabbitMQEnv, RabbitMQDefault, RabbitMQURL, PingRabbitMQ},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.f(t)
			if want := Getenv(tc.env, tc.def); u != want {
				t.Fatalf("got %q, want %q", u, want)
			}
			if err := tc.ping(context.Background(), u); err != nil {
				t.Fatalf("the returned URL does not work: %v", err)
			}
		})
	}
}

// A mysql:// URL works as well as a DSN, store options in it included.
func TestMySQLURLForm(t *testing.T) {
	cfg, err := ParseMySQL(MySQLURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u := "mysql://" + cfg.User + "@" + cfg.Addr + "/" + cfg.DBName + "?table=idemq_x&timeout=3s"
	if cfg.Passwd != "" {
		u = "mysql://" + cfg.User + ":" + cfg.Passwd + "@" + cfg.Addr + "/" + cfg.DBName + "?table=idemq_x&timeout=3s"
	}
	t.Setenv(MySQLEnv, u)
	if got := MySQLURL(t); got != u {
		t.Fatalf("got %q, want %q", got, u)
	}
}

func TestParseMySQL(t *testing.T) {
	cfg, err := ParseMySQL("mysql://u:p%40ss@db.example/app?timeout=7s&table=t")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "u" || cfg.Passwd != "p@ss" || cfg.Addr != "db.example:3306" || cfg.DBName != "app" ||
		cfg.Timeout.String() != "7s" || len(cfg.Params) != 0 {
		t.Fatalf("parsed %+v", cfg)
	}
	if _, err := ParseMySQL("mysql://u:s3cr3t@[::1/x"); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("bad URL: err %v (nil, or shows the password)", err)
	}
}

func TestGetenv(t *testing.T) {
	t.Setenv("IDEMQ_SERVICETEST_X", "")
	if got := Getenv("IDEMQ_SERVICETEST_X", "def"); got != "def" {
		t.Fatalf("unset: %q", got)
	}
	t.Setenv("IDEMQ_SERVICETEST_X", "set")
	if got := Getenv("IDEMQ_SERVICETEST_X", "def"); got != "set" {
		t.Fatalf("set: %q", got)
	}
}

func TestURLPassesContextWithDeadline(t *testing.T) {
	t.Setenv("IDEMQ_SERVICETEST_X", "x://here")
	got := URL(t, "IDEMQ_SERVICETEST_X", "", func(ctx context.Context, u string) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("no deadline")
		}
		return nil
	})
	if got != "x://here" {
		t.Fatalf("got %q", got)
	}
}

// Under a real *testing.T with IDEMQ_REQUIRE_SERVICES=1, an unreachable
// service fails the test: checked by running this test binary again on
// TestUnreachableFailsRealTChild, which points at a closed port.
func TestUnreachableFailsRealT(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableFailsRealTChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), RequireEnv+"=1", "IDEMQ_SERVICETEST_CHILD=1",
		PostgresEnv+"=postgres://postgres@"+closedPort(t)+"/test?connect_timeout=2")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "--- FAIL: TestUnreachableFailsRealTChild") ||
		!strings.Contains(string(out), "set "+PostgresEnv) {
		t.Fatalf("child: %v, want a failure naming %s:\n%s", err, PostgresEnv, out)
	}
}

func TestUnreachableFailsRealTChild(t *testing.T) {
	if os.Getenv("IDEMQ_SERVICETEST_CHILD") != "1" {
		t.Skip("run by TestUnreachableFailsRealT")
	}
	PostgresURL(t)
	t.Error("PostgresURL returned for a closed port")
}
