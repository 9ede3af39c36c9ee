package publish

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/httpwait"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// TargetCallback is a tenant's signed callback.
const TargetCallback = "callback"

// Standard Webhooks headers (https://www.standardwebhooks.com).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// secretBytes decodes a Standard Webhooks secret: "whsec_" and base64.
func secretBytes(secret string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(b) == 0 {
		return nil, errors.New("callback secret is not whsec_ and base64")
	}
	return b, nil
}

// Sign is the webhook-signature of a callback: "v1," and the base64
// HMAC-SHA256, keyed with the secret's bytes, of "{id}.{timestamp}.{body}".
func Sign(secret, id string, at time.Time, body []byte) (string, error) {
	key, err := secretBytes(secret)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s.%d.", id, at.Unix())
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil)), nil
}

// Verify checks a callback's headers against its body as a receiver does:
// one of the space-separated v1 signatures matches, and the timestamp is
// within tolerance of now.
func Verify(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return errors.New("callback: missing webhook-id, webhook-timestamp or webhook-signature")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("callback: webhook-timestamp is not seconds")
	}
	at := time.Unix(sec, 0)
	if now.Sub(at) > tolerance || at.Sub(now) > tolerance {
		return errors.New("callback: webhook-timestamp outside the tolerance")
	}
	want, err := Sign(secret, id, at, body)
	if err != nil {
		return err
	}
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return errors.New("callback: no signature matches")
}

// CallbackBody is what a callback carries: the outcome, and an accepted
// work's result.
type CallbackBody struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      CallbackOutcome `json:"data"`
}

// CallbackOutcome is the data of a callback.
type CallbackOutcome struct {
	OutcomeID string          `json:"outcomeId"`
	WorkID    string          `json:"workId"`
	TenantID  string          `json:"tenantId"`
	Region    string          `json:"region"`
	Outcome   string          `json:"outcome"`
	Reason    string          `json:"reason,omitempty"`
	SourceID  string          `json:"sourceId,omitempty"`
	Revision  string          `json:"revision,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	Rerun     string          `json:"rerun,omitempty"`
}

// callback sends one signed callback. The outcome id is the webhook-id,
// the same on every try, so the receiver can drop a second copy. A failure
// is a RetryError that waits no less than the receiver's Retry-After; the
// publisher's backoff decides the rest.
func (p *Publisher) callback(ctx context.Context, url, secret, id string, body []byte) error {
	now := p.now()
	sig, err := Sign(secret, id, now, body)
	if err != nil {
		return fmt.Errorf("%w: %v", errFinal, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: callback: %v", errFinal, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "assay-publisher")
	req.Header.Set(HeaderID, id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, sig)
	resp, err := p.callbacks.Do(req)
	if err != nil {
		return &RetryError{Err: fmt.Errorf("callback: %w", err)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	ra, _ := httpwait.RetryAfter(resp.Header.Get("Retry-After"), now)
	return &RetryError{Wait: ra, Err: fmt.Errorf("callback: HTTP %d", resp.StatusCode)}
}

// callbackBody is what the tenant's endpoint gets for the outcome: the
// same bytes on every try.
func (p *Publisher) callbackBody(w *store.Work, output json.RawMessage) ([]byte, error) {
	data := CallbackOutcome{OutcomeID: event.OutcomeMsgID(w.ID, w.State), WorkID: w.ID, TenantID: w.TenantID, Region: w.Region, Outcome: w.State,
		Reason: w.Reason, SourceID: w.SourceID, Revision: w.Revision}
	switch w.State {
	case outcome.Accepted, outcome.Reviewed:
		data.Output = output
	case outcome.Dropped:
		data.Rerun = p.cfg.Rerun(w.ID)
	}
	// The time the work reached its outcome, as its row says, so a retry
	// made from the row sends what the first try sent.
	return json.Marshal(CallbackBody{Type: "work." + w.State, Timestamp: w.UpdatedAt.UTC(), Data: data})
}
