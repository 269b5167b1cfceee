package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
)

// keySecretEnv names the variable that holds the secret of the idempotency
// keys sent to the provider (at least effects.MinSecretLength bytes). Keep
// it stable: a new secret gives every message a new key, and a redelivery
// after the change would be charged again.
const keySecretEnv = "PAYMENTS_KEY_SECRET"

// provider is the payment provider's HTTP API, as the leased mode
// (--provider) calls it: POST {url}/charges with a JSON body and an
// Idempotency-Key header, answered with {"id": "ch_…"}.
type provider struct {
	url    string
	client *http.Client
	keyer  *effects.Keyer
}

func newProvider(url string) (*provider, error) {
	keyer, err := effects.NewKeyer([]byte(os.Getenv(keySecretEnv)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keySecretEnv, err)
	}
	return &provider{
		url: strings.TrimSuffix(url, "/"),
		// Transport sends the key the context carries; Timeout bounds one
		// attempt (the consumer's MaxLease bounds them all).
		client: &http.Client{Transport: &effects.Transport{}, Timeout: 30 * time.Second},
		keyer:  keyer,
	}, nil
}

// charge charges m's payment once, whatever the number of attempts: every
// attempt sends the key derived from (consumer, message id, "charge"), so
// the provider answers a repeat with the first charge. A refusal (4xx
// other than 409 and 429) is permanent; anything else is retried.
func (p *provider) charge(ctx context.Context, m *core.Message) (string, error) {
	pay, err := decode(m.Body)
	if err != nil {
		return "", err
	}
	body, _ := json.Marshal(pay)
	req, err := http.NewRequestWithContext(p.keyer.ForMessage(ctx, m, "charge"), http.MethodPost, p.url+"/charges", bytes.NewReader(body))
	if err != nil {
		return "", core.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("charging %s: %w", m.ID, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("charging %s: reading the answer: %w", m.ID, err)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusOK || code == http.StatusCreated:
	case code == http.StatusConflict || code == http.StatusTooManyRequests || code >= 500:
		return "", fmt.Errorf("charging %s: the provider answered %d: %s", m.ID, code, bytes.TrimSpace(answer))
	default:
		return "", core.Permanent(fmt.Errorf("charging %s: the provider refused it (%d): %s", m.ID, code, bytes.TrimSpace(answer)))
	}
	var ch struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &ch); err != nil || ch.ID == "" {
		return "", fmt.Errorf("charging %s: the provider's answer has no charge id: %q", m.ID, answer)
	}
	return ch.ID, nil
}

// killEnv names the fault-injection variable of the kill tests:
// "STAGE:N" makes the process SIGKILL itself the N-th time a stage of the
// leased mode ends well — "lease" (the claim in progress committed),
// "external" (the charge returned, the completion not yet committed),
// "commit" (the completion committed, the message not yet acknowledged).
const killEnv = "PAYMENTS_KILL_AT"

// killer is the StageObserver that kills the process at the point killEnv
// names.
type killer struct {
	log   *slog.Logger
	stage string
	at    int64
	seen  atomic.Int64
}

func newKiller(log *slog.Logger) (*killer, error) {
	v := os.Getenv(killEnv)
	if v == "" {
		return nil, nil
	}
	stage, n, ok := strings.Cut(v, ":")
	at, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || at < 1 || (stage != "lease" && stage != "external" && stage != "commit") {
		return nil, fmt.Errorf("%s=%q: want lease|external|commit:N", killEnv, v)
	}
	return &killer{log: log, stage: stage, at: at}, nil
}

func (k *killer) StartDecision(ctx context.Context, _ *core.Message) context.Context { return ctx }
func (k *killer) EndDecision(context.Context, *core.Message, core.Outcome)           {}
func (k *killer) StartStage(ctx context.Context, _ core.Stage) context.Context       { return ctx }

// EndStage kills the process at the chosen point.
func (k *killer) EndStage(_ context.Context, s core.Stage, err error) {
	if err == nil && string(s.Name) == k.stage && k.seen.Add(int64(len(s.Messages))) >= k.at {
		k.log.Warn("payments: killing the process with SIGKILL", "after_stage", k.stage, "messages", k.seen.Load())
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way: nothing more happens here
	}
}

var errNoProvider = errors.New("--lease and --window need --provider")
