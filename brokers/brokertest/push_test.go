package brokertest_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/brokers/brokertest"
	"github.com/idemq/idemq/brokers/webhook"
	"github.com/idemq/idemq/brokers/webhook/signature"
	"github.com/idemq/idemq/core/driver"
)

// The push suite must be able to fail. Each case runs it (the cases that
// should notice) in a child process over the webhook Source with one
// deliberate defect, and expects the named subtest to fail.
func TestPushSuiteCatchesBrokenSources(t *testing.T) {
	if os.Getenv("BROKERTEST_BROKEN_PUSH") != "" {
		t.Skip("inside a child run")
	}
	catchesDefects(t, "BROKERTEST_BROKEN_PUSH", "TestBrokenPushSource", []brokenCase{
		{"answers-on-receipt", "SendReceiveAck", "SendReceiveAck"},
		{"retry-answers-accepted", "RetryAnswersRetryLater", "RetryAnswersRetryLater"},
		{"retry-answers-accepted", "Pipeline/FailedHandlerIsRetriedNotDropped", "Pipeline/FailedHandlerIsRetriedNotDropped"},
		{"attempt-always-1", "RetryAnswersRetryLater", "RetryAnswersRetryLater"},
		{"dead-letter-drops", "DeadLetterParksAndAccepts", "DeadLetterParksAndAccepts"},
		{"release-accepts", "GracefulCloseWithRequestsInFlight", "GracefulCloseWithRequestsInFlight"},
		{"copies-handed-out", "CopyInFlightIsHeldBack/FirstAcked", "CopyInFlightIsHeldBack/FirstAcked"},
	})
}

// brokenCase is one defect a child run of a suite must notice.
type brokenCase struct {
	mode    string // the defect, the child's environment variable's value
	run     string // subtests to run
	wantBad string // the subtest that must fail
}

// catchesDefects runs test in a child process with the environment
// variable env set to "none", where the whole suite must pass, then once
// per case with env set to its mode, running its subtests, where its
// wantBad subtest must fail.
func catchesDefects(t *testing.T, env, test string, cases []brokenCase) {
	t.Run("control", func(t *testing.T) {
		// The wrapper without a defect passes the whole suite, so the
		// failures below come from the defects.
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env+"=none")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the suite failed the wrapper without a defect: %v\n%s", err, out)
		}
	})
	for _, c := range cases {
		t.Run(c.mode+"/"+c.run, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$/^"+c.run+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), env+"="+c.mode)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a wrapper whose %s:\n%s", c.mode, out)
			}
			if !strings.Contains(string(out), "--- FAIL: "+test+"/"+c.wantBad) {
				t.Fatalf("want subtest %s to fail; output:\n%s", c.wantBad, out)
			}
		})
	}
}

const brokenSecret = "brokertest push secret"

// TestBrokenPushSource is the child run of TestPushSuiteCatchesBrokenSources.
func TestBrokenPushSource(t *testing.T) {
	mode := os.Getenv("BROKERTEST_BROKEN_PUSH")
	if mode == "" {
		t.Skip("run as a child of TestPushSuiteCatchesBrokenSources")
	}
	brokertest.RunPush(t, brokertest.PushHarness{
		RecordsCause:   true,
		Quiet:          200 * time.Millisecond,
		ReceiveTimeout: 5 * time.Second,
		Open: func(t *testing.T) *brokertest.PushFixture {
			p, err := signature.GitHub([]string{brokenSecret})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			src, err := webhook.NewSource(webhook.WithProfile(p), webhook.WithParkDir(dir), webhook.WithWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var h http.Handler = src
			if mode == "answers-on-receipt" {
				h = answerOnReceipt(src)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			return &brokertest.PushFixture{
				Source: &brokenPush{Source: src, mode: mode},
				Send: func(ctx context.Context, m *driver.Message) (brokertest.Answer, error) {
					id := m.ID
					if mode == "copies-handed-out" && id != "" {
						// Each copy a new event to the inbox; the wrapper
						// gives the Consumer the id back.
						id += "~" + strconv.FormatInt(time.Now().UnixNano(), 36)
					}
					return sendGitHub(ctx, srv.URL, id, m)
				},
				DeadLetters: func(ctx context.Context) ([]brokertest.DeadLetter, error) {
					names, err := os.ReadDir(dir)
					if err != nil {
						return nil, err
					}
					var out []brokertest.DeadLetter
					for _, n := range names {
						if !strings.HasSuffix(n.Name(), ".json") {
							continue
						}
						pr, err := webhook.ReadParked(filepath.Join(dir, n.Name()))
						if err != nil {
							return nil, err
						}
						out = append(out, brokertest.DeadLetter{ID: pr.ID, Body: pr.Body, Cause: pr.Cause})
					}
					return out, nil
				},
			}
		},
	})
}

// sendGitHub posts m to url signed as GitHub signs, under delivery id id,
// and reads the reply.
func sendGitHub(ctx context.Context, url, id string, m *driver.Message) (brokertest.Answer, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(m.Body))
	if err != nil {
		return brokertest.Answer{}, err
	}
	for k, v := range m.Headers {
		r.Header.Set(k, v)
	}
	sig := hmac.New(sha256.New, []byte(brokenSecret))
	sig.Write(m.Body)
	r.Header.Set(signature.HeaderGitHubSignature, "sha256="+hex.EncodeToString(sig.Sum(nil)))
	if id != "" {
		r.Header.Set(signature.HeaderGitHubDelivery, id)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return brokertest.Answer{}, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	a := brokertest.Answer{Accepted: resp.StatusCode/100 == 2, Detail: resp.Status}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		a.RetryAfter = time.Duration(s) * time.Second
	}
	return a, nil
}

// answerOnReceipt answers 200 as soon as a request is read, and hands it
// to src in the background: the sender is gone before the settlement.
func answerOnReceipt(src http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		bg := r.Clone(context.Background())
		bg.Body = io.NopCloser(bytes.NewReader(body))
		go src.ServeHTTP(httptest.NewRecorder(), bg)
		w.WriteHeader(http.StatusOK)
	})
}

// brokenPush is a webhook Source with one deliberate defect.
type brokenPush struct {
	*webhook.Source
	mode string
}

func (b *brokenPush) Serve(ctx context.Context, deliver driver.Deliver) error {
	return b.Source.Serve(ctx, func(ctx context.Context, m *driver.Message) error {
		switch b.mode {
		case "attempt-always-1":
			m.Attempt = 1
		case "copies-handed-out":
			m.ID, _, _ = strings.Cut(m.ID, "~")
		}
		return deliver(ctx, m)
	})
}

func (b *brokenPush) Retry(ctx context.Context, ms []*driver.Message, delay time.Duration) error {
	if b.mode == "retry-answers-accepted" {
		return b.Source.Ack(ctx, ms)
	}
	return b.Source.Retry(ctx, ms, delay)
}

func (b *brokenPush) DeadLetter(ctx context.Context, ms []*driver.Message, causes []error) error {
	if b.mode == "dead-letter-drops" {
		return b.Source.Ack(ctx, ms) // answered accepted, never parked
	}
	return b.Source.DeadLetter(ctx, ms, causes)
}

func (b *brokenPush) Release(ctx context.Context, ms []*driver.Message) error {
	if b.mode == "release-accepts" {
		return b.Source.Ack(ctx, ms) // the sender drops what was never processed
	}
	return b.Source.Release(ctx, ms)
}
