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
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
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
// the same on every retry, so the receiver can drop a second copy. A
// failure is a RetryError that waits a capped exponential backoff on the
// publication's tries, and no less than the receiver's Retry-After.
func (p *Publisher) callback(ctx context.Context, url, secret, id string, body []byte, tries int) error {
	now := time.Now()
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
	wait := min(p.cfg.CallbackBackoff<<min(tries, 20), p.cfg.CallbackMaxBackoff)
	resp, err := p.callbacks.Do(req)
	if err != nil {
		return &RetryError{Wait: wait, Err: fmt.Errorf("callback: %w", err)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	if ra, ok := retryAfterHeader(resp.Header.Get("Retry-After"), now); ok {
		wait = max(ra, wait)
	}
	return &RetryError{Wait: wait, Err: fmt.Errorf("callback: HTTP %d", resp.StatusCode)}
}

// toCallback sends the outcome to the tenant's endpoint behind the
// publication fence: once it has been delivered, a redelivered outcome
// sends nothing more.
func (p *Publisher) toCallback(ctx context.Context, w *store.Work, ev event.Outcome, cb store.Callback, output json.RawMessage) error {
	pub, release, err := p.st.LockPublication(ctx, w.ID, TargetCallback, w.TenantID, ev.Outcome)
	if errors.Is(err, store.ErrPublicationBusy) {
		return &RetryError{Wait: time.Second, Err: err}
	}
	if err != nil {
		return err
	}
	defer release()
	if !pub.PublishedAt.IsZero() && pub.Outcome == ev.Outcome {
		return nil
	}
	data := CallbackOutcome{OutcomeID: ev.OutcomeID, WorkID: w.ID, TenantID: w.TenantID, Region: w.Region, Outcome: w.State,
		Reason: w.Reason, SourceID: w.SourceID, Revision: w.Revision}
	switch w.State {
	case outcome.Accepted:
		data.Output = output
	case outcome.Dropped:
		data.Rerun = p.cfg.Rerun(w.ID)
	}
	at := ev.At
	if at.IsZero() {
		at = w.UpdatedAt
	}
	body, err := json.Marshal(CallbackBody{Type: "work." + w.State, Timestamp: at.UTC(), Data: data})
	if err != nil {
		return err
	}
	if err := p.callback(ctx, cb.URL, cb.Secret, ev.OutcomeID, body, pub.Tries); err != nil {
		_ = p.st.FailPublication(context.WithoutCancel(ctx), w.ID, TargetCallback, err.Error())
		p.count(ctx, TargetCallback, "failed")
		return err
	}
	if err := p.st.FinishPublication(ctx, w.ID, TargetCallback, ev.Outcome, body); err != nil {
		return err
	}
	p.count(ctx, TargetCallback, "published")
	telemetry.Decision(ctx, p.log, w.ID, "published", ev.Outcome+" to the tenant's callback")
	return nil
}
