package effectstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/effects"
)

// defaultClient sends the idempotency key its requests' contexts carry.
var defaultClient = &http.Client{Transport: &effects.Transport{}}

// StatusError is the error PostCharge returns when a provider answers with
// a status other than 2xx.
type StatusError struct {
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Code is the JSON error's code (idempotency_key_in_use, …), "" when
	// the body is not a Provider's JSON error.
	Code string
	// Message is the JSON error's message, or else the start of the body.
	Message string
}

// Error describes the answer.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("effectstest: POST /charges: %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Code != "" {
		s += ": " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Retryable reports whether the same request can succeed later: for 409
// (the key's first request is still in flight), 429 (rate limited) and
// 5xx. Any other status says the request itself is wrong.
func (e *StatusError) Retryable() bool {
	return e.StatusCode == http.StatusConflict || e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// PostCharge asks the provider at baseURL (Provider.URL) for a charge: it
// POSTs body, encoded as JSON, to baseURL/charges through client, and
// returns the charge answered, new or replayed. The idempotency key is the
// client's to send: a nil client is one whose Transport is an
// effects.Transport, which sends the key that ctx carries
// (effects.WithIdempotencyKey, Keyer.ForMessage).
//
// Its errors are classified for an idemq handler, which can return them as
// they are:
//   - a 409, 429 or 5xx answer (a *StatusError) and a network error or
//     the end of ctx are transient: the message is retried, with the same
//     key, and a charge made by a request whose answer was lost is then
//     replayed;
//   - any other answer (400 missing key or bad body, 422 key reused with
//     another body, …), a body that cannot be encoded and a 2xx answer
//     that is not a charge are permanent (core.Permanent): retrying sends
//     the same request and gets the same answer.
//
// errors.As finds the *StatusError in either.
func PostCharge(ctx context.Context, client *http.Client, baseURL string, body any) (Charge, error) {
	if client == nil {
		client = defaultClient
	}
	b, err := json.Marshal(body)
	if err != nil {
		return Charge{}, core.Permanent(fmt.Errorf("effectstest: charge body: %w", err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+"/charges", bytes.NewReader(b))
	if err != nil {
		return Charge{}, core.Permanent(fmt.Errorf("effectstest: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Charge{}, fmt.Errorf("effectstest: POST /charges: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return Charge{}, fmt.Errorf("effectstest: POST /charges: reading the answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		se := &StatusError{StatusCode: resp.StatusCode}
		var ae apiError
		if json.Unmarshal(data, &ae) == nil && ae.Error.Code != "" {
			se.Code, se.Message = ae.Error.Code, ae.Error.Message
		} else {
			se.Message = strings.TrimSpace(string(data[:min(len(data), 200)]))
		}
		if se.Retryable() {
			return Charge{}, se
		}
		return Charge{}, core.Permanent(se)
	}
	var c Charge
	if err := json.Unmarshal(data, &c); err != nil || c.ID == "" {
		if err == nil {
			err = errors.New(`no "id"`)
		}
		return Charge{}, core.Permanent(fmt.Errorf("effectstest: POST /charges: %d answer is not a charge: %w", resp.StatusCode, err))
	}
	return c, nil
}
