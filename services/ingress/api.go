package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// SubmitRequest is the body of POST /v1/work.
type SubmitRequest struct {
	Contract string          `json:"contract"`
	SourceID string          `json:"sourceId"`
	Revision string          `json:"revision"`
	Lane     string          `json:"lane,omitempty"`
	Input    json.RawMessage `json:"input"`
	// DeadlineSeconds overrides the lane's default deadline.
	DeadlineSeconds int `json:"deadlineSeconds,omitempty"`
}

// SubmitResponse answers POST /v1/work.
type SubmitResponse struct {
	WorkID    string `json:"workId"`
	State     string `json:"state"`
	Duplicate bool   `json:"duplicate"`
	Region    string `json:"region"`
	Links     Links  `json:"links"`
}

// Links point at the work's resources.
type Links struct {
	Self string `json:"self"`
}

// WorkView answers GET /v1/work/{id}.
type WorkView struct {
	WorkID     string          `json:"workId"`
	TenantID   string          `json:"tenantId"`
	Region     string          `json:"region"`
	Contract   string          `json:"contract"`
	SourceID   string          `json:"sourceId"`
	Revision   string          `json:"revision"`
	Lane       string          `json:"lane"`
	State      string          `json:"state"`
	Outcome    *string         `json:"outcome"`
	Reason     string          `json:"reason,omitempty"`
	DeadlineAt time.Time       `json:"deadlineAt"`
	CreatedAt  time.Time       `json:"createdAt"`
	UpdatedAt  time.Time       `json:"updatedAt"`
	Attempts   []store.Attempt `json:"attempts"`
	Result     *store.Result   `json:"result,omitempty"`
}

var (
	// sourceRE admits owner/repo#number and other printable ids, no spaces.
	sourceRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/#:@+-]{0,199}$`)
	revisionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)
)

// authenticate resolves the bearer token to a tenant of this cell, or
// writes the error and returns false.
func (s *Service) authenticate(w http.ResponseWriter, r *http.Request) (store.Tenant, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		apierror.Write(w, http.StatusUnauthorized, "unauthenticated", "send an API token as 'Authorization: Bearer <token>'")
		return store.Tenant{}, false
	}
	t, err := s.d.Store.TenantByToken(r.Context(), strings.TrimSpace(tok))
	if errors.Is(err, store.ErrNotFound) {
		apierror.Write(w, http.StatusUnauthorized, "unauthenticated", "unknown or revoked API token")
		return store.Tenant{}, false
	}
	if err != nil {
		s.d.Log.Error("token lookup failed", "err", err)
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; try again")
		return store.Tenant{}, false
	}
	if t.Status != "active" {
		apierror.Write(w, http.StatusForbidden, "tenant_suspended", fmt.Sprintf("tenant %s is suspended", t.ID))
		return store.Tenant{}, false
	}
	if t.HomeRegion != s.cfg.Region {
		apierror.Write(w, http.StatusMisdirectedRequest, "wrong_region",
			fmt.Sprintf("tenant %s is homed in region %s; send this request to the %s cell, this is %s",
				t.ID, t.HomeRegion, t.HomeRegion, s.cfg.Region))
		return store.Tenant{}, false
	}
	return t, true
}

func (s *Service) submit(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.d.Tel.Tracer().Start(r.Context(), "ingress.submit", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	r = r.WithContext(ctx)
	t, ok := s.authenticate(w, r)
	if !ok {
		s.count(ctx, "unauthenticated")
		return
	}
	req, code, msg := s.decodeSubmit(w, r)
	if code != "" {
		s.count(ctx, code)
		status := http.StatusBadRequest
		if code == "payload_too_large" {
			status = http.StatusRequestEntityTooLarge
		}
		apierror.Write(w, status, code, msg)
		return
	}
	c, _ := s.d.Contracts.Get(req.Contract)
	deadline := s.cfg.InteractiveDeadline
	if req.Lane == event.Batch {
		deadline = s.cfg.BatchDeadline
	}
	if req.DeadlineSeconds > 0 {
		deadline = time.Duration(req.DeadlineSeconds) * time.Second
	}
	input := compact(req.Input)
	work := &store.Work{
		ID:              WorkID(t.ID, c.Name, req.SourceID, req.Revision),
		TenantID:        t.ID,
		Region:          s.cfg.Region,
		Contract:        c.Name,
		SchemaVersion:   c.SchemaVersion,
		TaxonomyVersion: c.TaxonomyVersion,
		SourceID:        req.SourceID,
		Revision:        req.Revision,
		Lane:            req.Lane,
		Input:           string(input),
		Digest:          Digest(input),
		DeadlineAt:      time.Now().Add(deadline),
		// A new revision of the same source replaces the older one's work.
		SupersedeOlder: true,
	}
	span.SetAttributes(attribute.String("assay.work_id", work.ID), attribute.String("assay.tenant", t.ID))
	if wait, ok := s.admit(t, req.Lane); !ok {
		// A key already accepted costs nothing, over the rate or not.
		if got, err := s.d.Store.GetWork(ctx, work.ID); err == nil && got.State != "dropped" {
			s.count(ctx, "duplicate")
			telemetry.Decision(ctx, s.d.Log, got.ID, "duplicate", "ingress key already accepted",
				slog.String("tenant", t.ID), slog.String("state", got.State))
			apierror.JSON(w, http.StatusOK, SubmitResponse{WorkID: got.ID, State: got.State, Duplicate: true,
				Region: got.Region, Links: Links{Self: "/v1/work/" + got.ID}})
			return
		}
		secs := int(math.Ceil(wait.Seconds()))
		s.count(ctx, "rate_limited")
		telemetry.Decision(ctx, s.d.Log, work.ID, "refused", overRate(t, req.Lane),
			slog.String("tenant", t.ID), slog.Duration("retry_after", wait))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		apierror.Write(w, http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("%s; retry after %d s (nothing was stored)", overRate(t, req.Lane), secs))
		return
	}
	got, created, err := s.d.Store.InsertWork(ctx, work, s.announce(ctx))
	if err != nil {
		s.d.Log.Error("insert work failed", "key", work.ID, "err", err)
		s.count(ctx, "unavailable")
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the work was not stored; try again")
		return
	}
	resp := SubmitResponse{WorkID: got.ID, State: got.State, Duplicate: !created, Region: got.Region,
		Links: Links{Self: "/v1/work/" + got.ID}}
	if created {
		s.relay.Kick()
		s.logSuperseded(ctx, got)
		s.count(ctx, "accepted")
		telemetry.Decision(ctx, s.d.Log, got.ID, "queued", "new ingress key",
			slog.String("tenant", t.ID), slog.String("source", req.SourceID), slog.String("revision", req.Revision))
		apierror.JSON(w, http.StatusAccepted, resp)
		return
	}
	s.count(ctx, "duplicate")
	telemetry.Decision(ctx, s.d.Log, got.ID, "duplicate", "ingress key already accepted",
		slog.String("tenant", t.ID), slog.String("state", got.State))
	apierror.JSON(w, http.StatusOK, resp)
}

// decodeSubmit reads the body strictly and validates it. A non-empty code
// means the request is refused.
func (s *Service) decodeSubmit(w http.ResponseWriter, r *http.Request) (req SubmitRequest, code, msg string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return req, "payload_too_large", fmt.Sprintf("request body is over %d bytes", s.cfg.MaxBodyBytes)
		}
		return req, "bad_request", "could not read the request body"
	}
	if err := DecodeSubmit(body, &req); err != nil {
		return req, "invalid_json", err.Error()
	}
	if req.Lane == "" {
		req.Lane = event.Interactive
	}
	c, ok := s.d.Contracts.Get(req.Contract)
	switch {
	case !ok:
		return req, "unknown_contract", fmt.Sprintf("contract %q is not known (known: %s)", req.Contract, strings.Join(s.d.Contracts.Names(), ", "))
	case !sourceRE.MatchString(req.SourceID):
		return req, "invalid_source_id", "sourceId must be 1-200 characters of letters, digits and ._/#:@+- (e.g. owner/repo#42)"
	case !revisionRE.MatchString(req.Revision):
		return req, "invalid_revision", "revision must be 1-100 characters of letters, digits and ._- (e.g. a commit SHA)"
	case !event.ValidLane(req.Lane):
		return req, "invalid_lane", fmt.Sprintf("lane %q is not one of interactive, batch", req.Lane)
	case req.DeadlineSeconds < 0 || req.DeadlineSeconds > 7*24*3600:
		return req, "invalid_deadline", "deadlineSeconds must be between 1 and 604800"
	case len(req.Input) == 0:
		return req, "invalid_input", "input is required"
	}
	if err := c.ValidateInput(req.Input); err != nil {
		return req, "invalid_input", err.Error()
	}
	return req, "", ""
}

// DecodeSubmit decodes a submission strictly: one JSON object, known fields
// only, nothing after it.
func DecodeSubmit(body []byte, req *SubmitRequest) error {
	// A JSON null decodes into a struct without error and leaves it zero.
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) > 0 && b[0] != '{' {
		return errors.New("request body: must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return fmt.Errorf("request body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("request body: unexpected data after the JSON object")
	}
	return nil
}

func compact(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	t, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	v, err := s.View(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.TenantID != t.ID) {
		// Another tenant's work is indistinguishable from no work.
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id for this tenant")
		return
	}
	if err != nil {
		s.d.Log.Error("read work failed", "key", r.PathValue("id"), "err", err)
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; try again")
		return
	}
	apierror.JSON(w, http.StatusOK, v)
}

// View reads what GET /v1/work/{id} shows.
func (s *Service) View(ctx context.Context, id string) (*WorkView, error) {
	wk, err := s.d.Store.GetWork(ctx, id)
	if err != nil {
		return nil, err
	}
	v := &WorkView{WorkID: wk.ID, TenantID: wk.TenantID, Region: wk.Region, Contract: wk.Contract,
		SourceID: wk.SourceID, Revision: wk.Revision, Lane: wk.Lane, State: wk.State, Reason: wk.Reason,
		DeadlineAt: wk.DeadlineAt, CreatedAt: wk.CreatedAt, UpdatedAt: wk.UpdatedAt}
	if wk.Terminal() {
		o := wk.State
		v.Outcome = &o
	}
	if v.Attempts, err = s.d.Store.Attempts(ctx, id); err != nil {
		return nil, err
	}
	if v.Attempts == nil {
		v.Attempts = []store.Attempt{}
	}
	if wk.State == "accepted" {
		if v.Result, err = s.d.Store.GetResult(ctx, id); err != nil {
			return nil, err
		}
	}
	return v, nil
}
