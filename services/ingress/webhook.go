package ingress

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// WebhookContract is the contract a pull request is reviewed under.
const WebhookContract = "code-review"

// maxTitleRunes is the code-review input schema's maxLength for title.
const maxTitleRunes = 300

// PullRequestEvent is the part of GitHub's pull_request event payload that
// ingress reads. Every other field is tolerated and ignored, since GitHub
// adds fields over time; the ones named here must have GitHub's types.
type PullRequestEvent struct {
	Action       string        `json:"action"`
	Number       int64         `json:"number"`
	PullRequest  PullRequest   `json:"pull_request"`
	Repository   Repository    `json:"repository"`
	Installation *Installation `json:"installation"`
}

// PullRequest is the pull_request object of the event.
type PullRequest struct {
	Number int64  `json:"number"`
	Title  string `json:"title"`
	Head   GitRef `json:"head"`
	Base   GitRef `json:"base"`
	// UpdatedAt orders revisions that arrive out of order.
	UpdatedAt time.Time `json:"updated_at"`
}

// GitRef is a pull request's head or base.
type GitRef struct {
	SHA string `json:"sha"`
}

// Repository is the repository the event is about.
type Repository struct {
	FullName string `json:"full_name"`
}

// Installation is the GitHub App installation that sent the event; absent
// for a repository webhook.
type Installation struct {
	ID int64 `json:"id"`
}

var (
	// GitHub owner logins are letters, digits and hyphens (at most 39);
	// repository names letters, digits and ._- (at most 100).
	fullNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$`)
	// SHA-1 object names, or SHA-256 ones for repositories that use them.
	shaRE      = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)
	actionRE   = regexp.MustCompile(`^[a-z_]{1,64}$`)
	eventRE    = regexp.MustCompile(`^[a-z_]{1,64}$`)
	deliveryRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,99}$`)
)

// reviewed are the pull_request actions that put a new head up for review.
var reviewed = map[string]bool{"opened": true, "synchronize": true, "reopened": true}

// Owner is the repository owner's login.
func (e *PullRequestEvent) Owner() string {
	o, _, _ := strings.Cut(e.Repository.FullName, "/")
	return o
}

// Repo is the repository's name without its owner.
func (e *PullRequestEvent) Repo() string {
	_, r, _ := strings.Cut(e.Repository.FullName, "/")
	return r
}

// SourceID is the ingress key's source for the pull request: owner/repo#number.
func (e *PullRequestEvent) SourceID() string {
	return e.Repository.FullName + "#" + strconv.FormatInt(e.Number, 10)
}

// DecodePullRequestEvent decodes a pull_request payload: one JSON object,
// nothing after it, the fields ingress uses present, of the right type and
// well formed. Unknown fields are ignored.
func DecodePullRequestEvent(body []byte) (*PullRequestEvent, error) {
	// A JSON null decodes into a struct without error and leaves it zero.
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return nil, errors.New("payload: must be a JSON object")
	}
	var e PullRequestEvent
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("payload: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("payload: unexpected data after the JSON object")
	}
	switch {
	case !actionRE.MatchString(e.Action):
		return nil, errors.New("payload: action must be a lower-case word")
	case e.Number <= 0:
		return nil, errors.New("payload: number must be a positive integer")
	case e.PullRequest.Number != e.Number:
		return nil, errors.New("payload: pull_request.number does not match number")
	case !fullNameRE.MatchString(e.Repository.FullName) || e.Repo() == "." || e.Repo() == "..":
		return nil, errors.New("payload: repository.full_name must be owner/repo")
	case !shaRE.MatchString(e.PullRequest.Head.SHA):
		return nil, errors.New("payload: pull_request.head.sha must be a full lower-case hex commit id")
	case e.Installation != nil && e.Installation.ID <= 0:
		return nil, errors.New("payload: installation.id must be a positive integer")
	}
	return &e, nil
}

// VerifySignature checks GitHub's X-Hub-Signature-256 header: "sha256="
// and the hex HMAC-SHA256 of the raw body keyed with the webhook secret.
// The comparison takes the same time wherever the first difference is.
func VerifySignature(secret string, body []byte, header string) bool {
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || secret == "" {
		return false
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// Sign returns the X-Hub-Signature-256 value for body, as GitHub computes it.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// WebhookResponse answers a delivery that maps to work.
type WebhookResponse struct {
	SubmitResponse
	Delivery string `json:"delivery"`
	// Reason is set when admission dropped the work: why, and the command
	// that asks again.
	Reason string `json:"reason,omitempty"`
}

// IgnoredResponse answers a delivery that asks for no work.
type IgnoredResponse struct {
	Ignored string `json:"ignored"`
}

func (s *Service) githubWebhook(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.d.Tel.Tracer().Start(r.Context(), "ingress.webhook.github", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	fail := func(status int, code, msg string) {
		s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", code), attribute.String("region", s.cfg.Region)))
		apierror.Write(w, status, code, msg)
	}
	if s.cfg.GitHubSecret == "" {
		fail(http.StatusServiceUnavailable, "webhooks_disabled", "this cell has no GitHub webhook secret configured")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			fail(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("request body is over %d bytes", s.cfg.MaxBodyBytes))
			return
		}
		fail(http.StatusBadRequest, "bad_request", "could not read the request body")
		return
	}
	if !VerifySignature(s.cfg.GitHubSecret, body, r.Header.Get("X-Hub-Signature-256")) {
		s.d.Log.WarnContext(ctx, "webhook signature refused", "delivery", clip(r.Header.Get("X-GitHub-Delivery")))
		fail(http.StatusUnauthorized, "invalid_signature", "X-Hub-Signature-256 is missing or does not match the body")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		// GitHub can also send the payload form-encoded; only JSON is read.
		fail(http.StatusUnsupportedMediaType, "unsupported_media_type", "set the webhook's content type to application/json")
		return
	}
	// The signature covers the body only; the headers are checked here.
	deliveryID, ev := r.Header.Get("X-GitHub-Delivery"), r.Header.Get("X-GitHub-Event")
	if !deliveryRE.MatchString(deliveryID) {
		fail(http.StatusBadRequest, "invalid_delivery", "X-GitHub-Delivery must be 1-100 letters, digits and hyphens")
		return
	}
	if !eventRE.MatchString(ev) {
		fail(http.StatusBadRequest, "invalid_event", "X-GitHub-Event must be a lower-case event name")
		return
	}
	key := "delivery:" + deliveryID
	span.SetAttributes(attribute.String("github.delivery", deliveryID), attribute.String("github.event", ev))
	ignore := func(reason string, attrs ...slog.Attr) {
		s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "ignored"), attribute.String("region", s.cfg.Region)))
		telemetry.Decision(ctx, s.d.Log, key, "ignored", reason, append(attrs, slog.String("event", ev))...)
		apierror.JSON(w, http.StatusOK, IgnoredResponse{Ignored: reason})
	}
	if ev != "pull_request" {
		ignore(fmt.Sprintf("event %s is not reviewed", ev))
		return
	}
	pr, err := DecodePullRequestEvent(body)
	if err != nil {
		fail(http.StatusBadRequest, "invalid_payload", err.Error())
		return
	}
	source := pr.SourceID()
	if !reviewed[pr.Action] {
		ignore(fmt.Sprintf("pull_request action %s is not reviewed", pr.Action), slog.String("source", source))
		return
	}
	t, via, err := s.webhookTenant(ctx, pr)
	if errors.Is(err, store.ErrNotFound) {
		telemetry.Decision(ctx, s.d.Log, key, "refused", "no tenant linked to "+via, slog.String("source", source))
		fail(http.StatusNotFound, "unknown_installation", via+" is not linked to a tenant")
		return
	}
	if err != nil {
		s.d.Log.ErrorContext(ctx, "webhook tenant lookup failed", "key", key, "err", err)
		fail(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
		return
	}
	if t.Status != "active" {
		telemetry.Decision(ctx, s.d.Log, key, "refused", "tenant suspended", slog.String("tenant", t.ID))
		fail(http.StatusForbidden, "tenant_suspended", fmt.Sprintf("tenant %s is suspended", t.ID))
		return
	}
	if t.HomeRegion != s.cfg.Region {
		telemetry.Decision(ctx, s.d.Log, key, "refused", "tenant homed in "+t.HomeRegion, slog.String("tenant", t.ID))
		fail(http.StatusMisdirectedRequest, "wrong_region",
			fmt.Sprintf("tenant %s is homed in region %s; point this webhook at the %s cell, this is %s",
				t.ID, t.HomeRegion, t.HomeRegion, s.cfg.Region))
		return
	}
	span.SetAttributes(attribute.String("assay.tenant", t.ID))

	// A redelivery costs neither a diff fetch nor a transaction. The
	// transaction below is still the fence when copies race.
	if d, err := s.d.Store.GetDelivery(ctx, deliveryID); err == nil {
		s.webhookDuplicate(ctx, w, d, nil)
		return
	} else if !errors.Is(err, store.ErrNotFound) {
		s.d.Log.ErrorContext(ctx, "webhook delivery lookup failed", "key", key, "err", err)
		fail(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
		return
	}

	ref := PullRef{Owner: pr.Owner(), Repo: pr.Repo(), Number: pr.Number, HeadSHA: pr.PullRequest.Head.SHA}
	diffText, err := s.cfg.Diffs.Diff(ctx, ref)
	if errors.Is(err, ErrDiffTooLarge) {
		telemetry.Decision(ctx, s.d.Log, key, "refused", "diff too large", slog.String("source", source))
		fail(http.StatusUnprocessableEntity, "diff_too_large", fmt.Sprintf("the diff of %s is over %d bytes", source, s.cfg.MaxDiffBytes))
		return
	}
	if err != nil {
		// Nothing is stored, so GitHub's redelivery of the same id is
		// processed in full.
		s.d.Log.WarnContext(ctx, "diff fetch failed", "key", key, "source", source, "err", err)
		fail(http.StatusBadGateway, "upstream_unavailable", "could not fetch the pull request's diff from GitHub; redeliver later")
		return
	}
	if strings.TrimSpace(diffText) == "" {
		ignore("pull request has no changes", slog.String("source", source))
		return
	}
	c, ok := s.d.Contracts.Get(WebhookContract)
	if !ok {
		s.d.Log.ErrorContext(ctx, "webhook contract missing", "contract", WebhookContract)
		fail(http.StatusServiceUnavailable, "unavailable", "contract "+WebhookContract+" is not loaded")
		return
	}
	input, err := reviewInput(diffText, pr.PullRequest.Title)
	if err == nil {
		err = c.ValidateInput(input)
	}
	if err != nil {
		telemetry.Decision(ctx, s.d.Log, key, "refused", "diff not reviewable", slog.String("source", source), slog.String("err", err.Error()))
		fail(http.StatusUnprocessableEntity, "invalid_diff", "the pull request's diff cannot be reviewed: "+err.Error())
		return
	}
	work := &store.Work{
		ID:              WorkID(t.ID, c.Name, source, ref.HeadSHA),
		TenantID:        t.ID,
		Region:          s.cfg.Region,
		Contract:        c.Name,
		SchemaVersion:   c.SchemaVersion,
		TaxonomyVersion: c.TaxonomyVersion,
		SourceID:        source,
		Revision:        ref.HeadSHA,
		Lane:            event.Interactive,
		Input:           string(input),
		Digest:          Digest(input),
		DeadlineAt:      time.Now().Add(s.cfg.InteractiveDeadline),
		SupersedeOlder:  true,
		SourceUpdatedAt: pr.PullRequest.UpdatedAt,
	}
	span.SetAttributes(attribute.String("assay.work_id", work.ID))
	if _, ok := s.admit(t, work.Lane); !ok {
		// GitHub does not retry a refused delivery: the work is stored
		// dropped, and its reason says how to ask again.
		work.DropReason = fmt.Sprintf("%s when this arrived; ask again with: %s", overRate(t, work.Lane), RerunCommand(work))
	}
	res, err := s.d.Store.InsertWebhookWork(ctx, store.Delivery{ID: deliveryID, TenantID: t.ID, Event: ev, Action: pr.Action},
		work, s.announce(ctx))
	if err != nil {
		s.d.Log.ErrorContext(ctx, "insert webhook work failed", "key", work.ID, "delivery", deliveryID, "err", err)
		fail(http.StatusServiceUnavailable, "unavailable", "the work was not stored; redeliver later")
		return
	}
	if !res.First {
		s.webhookDuplicate(ctx, w, res.Delivery, res.Work)
		return
	}
	resp := WebhookResponse{SubmitResponse: SubmitResponse{WorkID: res.Work.ID, State: res.Work.State, Duplicate: !res.Created,
		Region: res.Work.Region, Links: Links{Self: "/v1/work/" + res.Work.ID}}, Delivery: deliveryID}
	attrs := []slog.Attr{slog.String("tenant", t.ID), slog.String("source", source), slog.String("revision", ref.HeadSHA),
		slog.String("delivery", deliveryID), slog.String("action", pr.Action), slog.String("via", via)}
	if !res.Created {
		s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "duplicate"), attribute.String("region", s.cfg.Region)))
		telemetry.Decision(ctx, s.d.Log, res.Work.ID, "duplicate", "ingress key already accepted", attrs...)
		apierror.JSON(w, http.StatusOK, resp)
		return
	}
	s.relay.Kick()
	s.logSuperseded(ctx, res.Work)
	if res.Work.State == "dropped" {
		resp.Reason = res.Work.Reason
		s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "dropped"), attribute.String("region", s.cfg.Region)))
		telemetry.Decision(ctx, s.d.Log, res.Work.ID, "dropped", res.Work.Reason, attrs...)
		apierror.JSON(w, http.StatusAccepted, resp)
		return
	}
	s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "accepted"), attribute.String("region", s.cfg.Region)))
	reason := "new ingress key"
	if work.SupersedeOlder {
		reason = "new head; older revisions superseded"
	}
	telemetry.Decision(ctx, s.d.Log, res.Work.ID, "queued", reason, attrs...)
	apierror.JSON(w, http.StatusAccepted, resp)
}

// webhookDuplicate answers a delivery id already recorded: the work it
// produced, unchanged.
func (s *Service) webhookDuplicate(ctx context.Context, w http.ResponseWriter, d *store.Delivery, wk *store.Work) {
	s.webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", "duplicate_delivery"), attribute.String("region", s.cfg.Region)))
	resp := WebhookResponse{SubmitResponse: SubmitResponse{WorkID: d.WorkID, Duplicate: true, Region: s.cfg.Region}, Delivery: d.ID}
	if d.WorkID != "" {
		resp.Links.Self = "/v1/work/" + d.WorkID
		if wk == nil {
			wk, _ = s.d.Store.GetWork(ctx, d.WorkID)
		}
	}
	if wk != nil {
		resp.State, resp.Region = wk.State, wk.Region
	}
	telemetry.Decision(ctx, s.d.Log, "delivery:"+d.ID, "duplicate", "delivery already recorded",
		slog.String("work", d.WorkID), slog.String("tenant", d.TenantID))
	apierror.JSON(w, http.StatusOK, resp)
}

// webhookTenant maps the delivery to a tenant: by the App installation when
// the payload names one that is linked, else by the repository. via names
// what was looked up, for messages.
func (s *Service) webhookTenant(ctx context.Context, pr *PullRequestEvent) (t store.Tenant, via string, err error) {
	if pr.Installation != nil {
		id := strconv.FormatInt(pr.Installation.ID, 10)
		t, err = s.d.Store.TenantBySource(ctx, store.SourceGitHubInstallation, id)
		if !errors.Is(err, store.ErrNotFound) {
			return t, "installation " + id, err
		}
		via = "installation " + id + " and "
	}
	via += "repository " + pr.Repository.FullName
	t, err = s.d.Store.TenantBySource(ctx, store.SourceGitHubRepository, pr.Repository.FullName)
	return t, via, err
}

// reviewInput builds the code-review input. The title is for context only,
// so control characters are dropped and it is cut to the schema's length
// rather than refusing the pull request.
func reviewInput(diffText, title string) ([]byte, error) {
	title = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(title, "\uFFFD"))
	title = strings.TrimSpace(title)
	if utf8.RuneCountInString(title) > maxTitleRunes {
		title = string([]rune(title)[:maxTitleRunes])
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// A diff is full of < > &; escaping them would only bloat the input.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(struct {
		Diff  string `json:"diff"`
		Title string `json:"title,omitempty"`
	}{diffText, title}); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// clip keeps an unauthenticated header short and printable for a log line.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.ToValidUTF8(s, "?")
}
