package webhook

import (
	"bytes"
	"context"
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

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/diffs"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
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
	// SHA-1 object names, or SHA-256 ones for repositories that use them.
	shaRE      = regexp.MustCompile(`^(?:[0-9a-f]{40}|[0-9a-f]{64})$`)
	actionRE   = regexp.MustCompile(`^[a-z_]{1,64}$`)
	eventRE    = regexp.MustCompile(`^[a-z_]{1,64}$`)
	deliveryRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,99}$`)
	// GitHub's X-Hub-Signature-256: the hex HMAC-SHA256 of the body.
	signatureRE = regexp.MustCompile(`^sha256=[0-9a-f]{64}$`)
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
	case !api.FullNameOK(e.Repository.FullName) || e.Repo() == "." || e.Repo() == "..":
		return nil, errors.New("payload: repository.full_name must be owner/repo")
	case !shaRE.MatchString(e.PullRequest.Head.SHA):
		return nil, errors.New("payload: pull_request.head.sha must be a full lower-case hex commit id")
	case e.PullRequest.Base.SHA != "" && !shaRE.MatchString(e.PullRequest.Base.SHA):
		return nil, errors.New("payload: pull_request.base.sha must be a full lower-case hex commit id")
	case e.Installation != nil && e.Installation.ID <= 0:
		return nil, errors.New("payload: installation.id must be a positive integer")
	}
	return &e, nil
}

// delivery is one webhook delivery as it moves through the stages of
// githubWebhook.
type delivery struct {
	id, event string
	body      []byte
	by        signer
	pr        *PullRequestEvent
	tenant    store.Tenant
	via       string // what the tenant was found by, for messages
}

// signer is whose secret signed a delivery: the cell's (its GitHub App's,
// held by the operator alone), or one tenant's own, which signs only the
// repository hooks of repositories linked to that tenant.
type signer struct {
	app    bool
	tenant string
}

// key names a delivery in the decision log; its id is the sender's, so
// only its digest is logged.
func (d *delivery) key() string { return DeliveryKey(d.id) }

// DeliveryKey is how the decision log names the delivery id: by digest.
func DeliveryKey(id string) string { return "delivery:" + telemetry.Opaque(id) }

// githubWebhook turns a GitHub delivery into code-review work in four
// stages: verify (secret, size, signature, content type, headers), parse
// (event, payload, action), route (tenant, admission to this cell, a
// delivery already recorded) and store (the diff, the work, the answer).
// Each stage that refuses answers with its error and the decision logged.
func (s *Room) githubWebhook(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.D.Tel.Tracer().Start(telemetry.FromCaller(r.Context(), r.Header), "ingress.webhook.github", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	d, refused := s.verifyDelivery(ctx, w, r)
	if refused == nil {
		span.SetAttributes(attribute.String("github.delivery", d.id), attribute.String("github.event", d.event))
		var ignored string
		if ignored, refused = s.parseDelivery(d); refused == nil && ignored != "" {
			s.ignore(ctx, w, d, ignored)
			return
		}
	}
	if refused == nil {
		var dup *store.Delivery
		if dup, refused = s.routeDelivery(ctx, d); refused == nil && dup != nil {
			s.webhookDuplicate(ctx, w, d.tenant.ID, dup, nil)
			return
		}
	}
	if refused != nil {
		s.countWebhook(ctx, refused.Code)
		if d != nil && refused.Code == "wrong_cell" {
			s.RefuseOrSendOn(w, r, d.tenant, refused, d.body)
			return
		}
		refused.Write(w)
		return
	}
	span.SetAttributes(attribute.String("assay.tenant", d.tenant.ID))
	s.storeDelivery(ctx, w, r, d)
}

// verifyDelivery checks everything about a delivery that does not need its
// payload understood. What headers can say (a signature of the right form,
// the content type, GitHub's delivery and event headers, a declared size)
// is checked before a byte of the body is read, so a caller without a
// credential is answered at once; then the body is read, within the size
// and the server's read timeout, and its signature verified.
func (s *Room) verifyDelivery(ctx context.Context, w http.ResponseWriter, r *http.Request) (*delivery, *apierror.Error) {
	sig := r.Header.Get("X-Hub-Signature-256")
	if !signatureRE.MatchString(sig) {
		return nil, apierror.New(http.StatusUnauthorized, "invalid_signature", "X-Hub-Signature-256 must be sha256= and 64 hex digits")
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		// GitHub can also send the payload form-encoded; only JSON is read.
		return nil, apierror.New(http.StatusUnsupportedMediaType, "unsupported_media_type", "set the webhook's content type to application/json")
	}
	d := &delivery{id: r.Header.Get("X-GitHub-Delivery"), event: r.Header.Get("X-GitHub-Event")}
	if !deliveryRE.MatchString(d.id) {
		return nil, apierror.New(http.StatusBadRequest, "invalid_delivery", "X-GitHub-Delivery must be 1-100 letters, digits and hyphens")
	}
	if !eventRE.MatchString(d.event) {
		return nil, apierror.New(http.StatusBadRequest, "invalid_event", "X-GitHub-Event must be a lower-case event name")
	}
	body, refused := request.ReadBody(w, r, s.Cfg.MaxBodyBytes)
	if refused != nil {
		return nil, refused
	}
	var err error
	if d.by, err = s.signedBy(ctx, body, sig); err != nil {
		s.D.Log.ErrorContext(ctx, "webhook secret lookup failed", "delivery", telemetry.Opaque(d.id), "err", err)
		return nil, apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
	}
	if !d.by.app && d.by.tenant == "" {
		s.D.Log.WarnContext(ctx, "webhook signature refused", "delivery", telemetry.Opaque(d.id))
		return nil, apierror.New(http.StatusUnauthorized, "invalid_signature", "X-Hub-Signature-256 does not match the body under any secret that may sign it")
	}
	if err := contract.CheckText(body); err != nil {
		return nil, apierror.New(http.StatusBadRequest, "invalid_payload", "payload has "+err.Error())
	}
	d.body = body
	return d, nil
}

// signedBy finds whose secret signed body: the cell's, else the secret of
// the tenant the payload's repository is linked to. A zero signer is no
// one's; an error is the database's.
func (s *Room) signedBy(ctx context.Context, body []byte, sig string) (signer, error) {
	if s.Cfg.GitHubSecret != "" && api.VerifySignature(s.Cfg.GitHubSecret, body, sig) {
		return signer{app: true}, nil
	}
	// Only to find which secret to try: nothing else is read from a body
	// before its signature holds.
	var peek struct {
		Repository Repository `json:"repository"`
	}
	if json.Unmarshal(body, &peek) != nil || !api.FullNameOK(peek.Repository.FullName) {
		return signer{}, nil
	}
	tenant, secret, err := s.D.Store.RepositorySecret(ctx, peek.Repository.FullName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return signer{}, nil
	case err != nil:
		return signer{}, err
	case api.VerifySignature(secret, body, sig):
		return signer{tenant: tenant}, nil
	}
	return signer{}, nil
}

// parseDelivery reads the payload of a verified delivery. ignored, when
// set, says why the delivery asks for no work.
func (s *Room) parseDelivery(d *delivery) (ignored string, refused *apierror.Error) {
	if d.event != "pull_request" {
		return fmt.Sprintf("event %s is not reviewed", d.event), nil
	}
	pr, err := DecodePullRequestEvent(d.body)
	if err != nil {
		return "", apierror.New(http.StatusBadRequest, "invalid_payload", err.Error())
	}
	d.pr = pr
	if !reviewed[pr.Action] {
		return fmt.Sprintf("pull_request action %s is not reviewed", pr.Action), nil
	}
	return "", nil
}

// routeDelivery finds the delivery's tenant and admits it to this cell.
// dup is the record of a delivery id already seen: a redelivery costs
// neither a diff fetch nor a transaction (the store's transaction is still
// the fence when copies race).
func (s *Room) routeDelivery(ctx context.Context, d *delivery) (dup *store.Delivery, refused *apierror.Error) {
	source := telemetry.OpaqueAttr("source", d.pr.SourceID())
	installation := ""
	if d.pr.Installation != nil && d.by.app {
		installation = strconv.FormatInt(d.pr.Installation.ID, 10)
	}
	links, err := s.D.Store.WebhookLinks(ctx, installation, d.pr.Repository.FullName)
	if err != nil {
		s.D.Log.ErrorContext(ctx, "webhook tenant lookup failed", "key", d.key(), "err", err)
		return nil, apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
	}
	t, via, refused := bind(d.pr, d.by, links)
	d.via = via
	if refused != nil {
		telemetry.Decision(ctx, s.D.Log, d.key(), "refused", refused.Message, source)
		return nil, refused
	}
	if refused := auth.Admit(t, s.Cell()); refused != nil {
		d.tenant = t // another cell of the region may serve it: the delivery goes on there
		telemetry.Decision(ctx, s.D.Log, d.key(), "refused", refused.Message, slog.String("tenant", t.ID))
		return nil, refused
	}
	d.tenant = t
	rec, err := s.D.Store.GetDelivery(ctx, d.id)
	if err == nil {
		return rec, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		s.D.Log.ErrorContext(ctx, "webhook delivery lookup failed", "key", d.key(), "err", err)
		return nil, apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
	}
	return nil, nil
}

// storeDelivery fetches the pull request's diff, makes the work and stores
// it with the delivery, then answers.
func (s *Room) storeDelivery(ctx context.Context, w http.ResponseWriter, r *http.Request, d *delivery) {
	work, ignored, refused := s.reviewWork(ctx, d)
	switch {
	case refused != nil:
		s.countWebhook(ctx, refused.Code)
		refused.Write(w)
		return
	case ignored != "":
		s.ignore(ctx, w, d, ignored)
		return
	}
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("assay.work_id", work.ID))
	dropped := "over_rate"
	if work.DropReason != "" {
		// Dropped before admission: nothing is asked of the model.
		dropped = outcome.ReasonDiffTooLarge
	} else if _, ok := s.Take(ctx, d.tenant, work.Lane); !ok {
		// GitHub does not retry a refused delivery: the work is stored
		// dropped, and its reason says how to ask again.
		work.DropReason = fmt.Sprintf("%s when this arrived; ask again with: %s", door.OverRate(d.tenant, work.Lane), door.RerunCommand(work))
	} else if r := s.AdmitCapacity(ctx, d.tenant, work); r != nil {
		dropped = r.Code
		work.DropReason = fmt.Sprintf("%s when this arrived; ask again with: %s", r.Reason, door.RerunCommand(work))
	}
	rec := store.Delivery{ID: d.id, TenantID: d.tenant.ID, Event: d.event, Action: d.pr.Action, BaseSHA: d.pr.PullRequest.Base.SHA}
	if d.pr.Installation != nil && d.by.app {
		// Only the App's own deliveries name an installation to publish as.
		rec.Installation = d.pr.Installation.ID
	}
	res, err := s.D.Store.InsertWebhookWork(ctx, rec, work, s.Announcer(ctx))
	if store.MovedOut(err) {
		// Admitted just before the tenant's cut: the delivery goes on to
		// the cell that serves the tenant now, as one that arrived later.
		s.countWebhook(ctx, "wrong_cell")
		s.MovedOut(w, r, d.tenant.ID, d.body)
		return
	}
	if err != nil {
		s.D.Log.ErrorContext(ctx, "insert webhook work failed", "key", work.ID, "delivery", telemetry.Opaque(d.id), "err", err)
		s.countWebhook(ctx, "unavailable")
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the work was not stored; redeliver later")
		return
	}
	if !res.First {
		s.webhookDuplicate(ctx, w, d.tenant.ID, res.Delivery, res.Work)
		return
	}
	resp := api.WebhookResponse{SubmitResponse: door.Submitted(res.Work, !res.Created), Delivery: d.id}
	attrs := []slog.Attr{slog.String("tenant", d.tenant.ID), telemetry.OpaqueAttr("source", work.SourceID), slog.String("revision", work.Revision),
		slog.String("delivery", telemetry.Opaque(d.id)), slog.String("action", d.pr.Action), slog.String("via", d.via)}
	switch {
	case !res.Created:
		s.countWebhook(ctx, "duplicate")
		telemetry.Decision(ctx, s.D.Log, res.Work.ID, "duplicate", "ingress key already accepted", attrs...)
		apierror.JSON(w, http.StatusOK, resp)
		return
	case res.Work.State == outcome.Dropped:
		s.Dropped.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.Cfg.Region),
			attribute.String("lane", res.Work.Lane), attribute.String("reason", dropped)))
		if dropped != "over_rate" && dropped != outcome.ReasonDiffTooLarge {
			s.CountShed(ctx, res.Work.Lane, dropped, "webhook")
		}
		s.Relay.Kick()
		s.LogSuperseded(ctx, res.Work)
		resp.Reason = res.Work.Reason
		s.countWebhook(ctx, outcome.Dropped)
		telemetry.Decision(ctx, s.D.Log, res.Work.ID, outcome.Dropped, res.Work.Reason, attrs...)
		apierror.JSON(w, http.StatusAccepted, resp)
		return
	}
	s.Relay.Kick()
	s.GoShadow(ctx, work)
	s.LogSuperseded(ctx, res.Work)
	s.countWebhook(ctx, outcome.Accepted)
	telemetry.Decision(ctx, s.D.Log, res.Work.ID, outcome.Queued, "new head; older revisions superseded", attrs...)
	apierror.JSON(w, http.StatusAccepted, resp)
}

// reviewWork fetches the delivery's diff and makes its code-review work.
// ignored, when set, says why the delivery asks for no work after all.
func (s *Room) reviewWork(ctx context.Context, d *delivery) (work *store.Work, ignored string, refused *apierror.Error) {
	pr, source := d.pr, telemetry.OpaqueAttr("source", d.pr.SourceID())
	ref := diffs.PullRef{Owner: pr.Owner(), Repo: pr.Repo(), Number: pr.Number, HeadSHA: pr.PullRequest.Head.SHA,
		BaseSHA: pr.PullRequest.Base.SHA}
	inst, err := s.diffInstallation(ctx, d)
	if err != nil {
		s.D.Log.ErrorContext(ctx, "webhook installation lookup failed", "key", d.key(), "err", err)
		return nil, "", apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; redeliver later")
	}
	ref.Installation = inst
	diffText, err := s.Cfg.Diffs.Diff(ctx, ref)
	if errors.Is(err, diffs.ErrDiffTooLarge) {
		return s.tooLarge(ctx, d, ref)
	}
	if err != nil {
		// Nothing is stored, so GitHub's redelivery of the same id is
		// processed in full.
		s.D.Log.WarnContext(ctx, "diff fetch failed", "key", d.key(), "source", telemetry.Opaque(pr.SourceID()), "err", err)
		return nil, "", apierror.New(http.StatusBadGateway, "upstream_unavailable", "could not fetch the pull request's diff from GitHub; redeliver later")
	}
	if strings.TrimSpace(diffText) == "" {
		return nil, "pull request has no changes", nil
	}
	if err := contract.CheckText([]byte(diffText)); err != nil {
		telemetry.Decision(ctx, s.D.Log, d.key(), "refused", "diff is not text: "+err.Error(), source)
		return nil, "", apierror.New(http.StatusBadRequest, "invalid_payload",
			"the pull request's diff has "+err.Error()+"; it cannot be stored or reviewed as text")
	}
	c, ok := s.D.Contracts.Get(WebhookContract)
	if !ok {
		s.D.Log.ErrorContext(ctx, "webhook contract missing", "contract", WebhookContract)
		return nil, "", apierror.New(http.StatusServiceUnavailable, "unavailable", "contract "+WebhookContract+" is not loaded")
	}
	c, _ = s.ContractFor(ctx, d.tenant.ID, c)
	input, err := reviewInput(diffText, pr.PullRequest.Title)
	if err == nil {
		err = c.ValidateInput(input)
	}
	if err != nil {
		telemetry.Decision(ctx, s.D.Log, d.key(), "refused", "diff not reviewable", source, slog.String("err", err.Error()))
		return nil, "", apierror.New(http.StatusUnprocessableEntity, "invalid_diff", "the pull request's diff cannot be reviewed: "+err.Error())
	}
	work = s.NewWork(ctx, d.tenant, c, pr.SourceID(), ref.HeadSHA, event.Interactive, input, time.Now().Add(s.Cfg.InteractiveDeadline))
	work.SourceUpdatedAt = pr.PullRequest.UpdatedAt
	return work, "", nil
}

// tooLarge is the work of a pull request whose diff is over the cell's
// cap: stored dropped, without its diff, so the pull request gets one
// comment that says why it was not reviewed and what would review it, and
// a redelivery finds the work and posts nothing again.
func (s *Room) tooLarge(ctx context.Context, d *delivery, ref diffs.PullRef) (*store.Work, string, *apierror.Error) {
	c, ok := s.D.Contracts.Get(WebhookContract)
	if !ok {
		return nil, "", apierror.New(http.StatusServiceUnavailable, "unavailable", "the review contract is not loaded; redeliver later")
	}
	input, _ := json.Marshal(map[string]string{"diff": "", "title": d.pr.PullRequest.Title})
	work := s.NewWork(ctx, d.tenant, c, d.pr.SourceID(), ref.HeadSHA, event.Interactive, input, time.Now().Add(s.Cfg.InteractiveDeadline))
	work.SourceUpdatedAt = d.pr.PullRequest.UpdatedAt
	work.DropReason = fmt.Sprintf("%s: the pull request's diff is over the %d bytes this installation reviews (ASSAY_MAX_DIFF_BYTES on the region's ingress, up to %d; larger diffs are reviewed in parts); once an operator raises it, the next push to the pull request is reviewed",
		outcome.ReasonDiffTooLarge, s.Cfg.MaxDiffBytes, api.MaxDiffCeiling)
	return work, "", nil
}

// ignore answers a delivery that asks for no work: 200 with the reason.
func (s *Room) ignore(ctx context.Context, w http.ResponseWriter, d *delivery, reason string) {
	attrs := []slog.Attr{slog.String("event", d.event)}
	if d.pr != nil {
		attrs = append(attrs, telemetry.OpaqueAttr("source", d.pr.SourceID()))
	}
	s.countWebhook(ctx, "ignored")
	telemetry.Decision(ctx, s.D.Log, d.key(), "ignored", reason, attrs...)
	apierror.JSON(w, http.StatusOK, api.IgnoredResponse{Ignored: reason})
}

func (s *Room) countWebhook(ctx context.Context, result string) {
	s.Webhooks.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result), attribute.String("region", s.Cfg.Region)))
}

// webhookDuplicate answers a delivery id already recorded: the work it
// produced, unchanged.
func (s *Room) webhookDuplicate(ctx context.Context, w http.ResponseWriter, tenant string, d *store.Delivery, wk *store.Work) {
	if d.TenantID != tenant {
		// Another tenant's delivery id: nothing of its work is told.
		s.countWebhook(ctx, "delivery_conflict")
		telemetry.Decision(ctx, s.D.Log, DeliveryKey(d.ID), "refused", "delivery id already recorded for another tenant",
			slog.String("tenant", tenant))
		apierror.Write(w, http.StatusConflict, "delivery_conflict", "X-GitHub-Delivery was already used by another delivery; nothing was recorded")
		return
	}
	s.countWebhook(ctx, "duplicate_delivery")
	resp := api.WebhookResponse{SubmitResponse: api.SubmitResponse{WorkID: d.WorkID, Duplicate: true, Region: s.Cfg.Region}, Delivery: d.ID}
	if d.WorkID != "" {
		resp.Links.Self = "/v1/work/" + d.WorkID
		if wk == nil {
			wk, _ = s.D.Store.GetWork(ctx, d.WorkID)
		}
	}
	if wk != nil {
		resp.State, resp.Region = wk.State, wk.Region
	}
	telemetry.Decision(ctx, s.D.Log, DeliveryKey(d.ID), "duplicate", "delivery already recorded",
		slog.String("work", d.WorkID), slog.String("tenant", d.TenantID))
	apierror.JSON(w, http.StatusOK, resp)
}

// bind decides a delivery's tenant from whose secret signed it and the
// links of its installation and repository. A tenant's secret speaks only
// for the repositories linked to that tenant. A delivery signed by the
// cell's secret that names an installation belongs to the installation's
// tenant, and only for a repository the installation covers (and no other
// tenant has linked); one whose installation is not linked, or that names
// none, belongs to the tenant its repository is linked to. via names what
// was looked up, for messages.
func bind(pr *PullRequestEvent, by signer, l store.WebhookLinks) (store.Tenant, string, *apierror.Error) {
	repo := pr.Repository.FullName
	if !by.app {
		if l.Repository == nil || l.Repository.Tenant.ID != by.tenant {
			return store.Tenant{}, "repository " + repo, apierror.New(http.StatusUnauthorized, "invalid_signature",
				"X-Hub-Signature-256 does not match the body under any secret that may sign it")
		}
		return l.Repository.Tenant, "repository " + repo + " (its tenant's secret)", nil
	}
	via := ""
	if pr.Installation != nil {
		id := strconv.FormatInt(pr.Installation.ID, 10)
		if in := l.Installation; in != nil {
			if !covers(in.Repositories, repo) || (l.Repository != nil && l.Repository.Tenant.ID != in.Tenant.ID) {
				return store.Tenant{}, "installation " + id, apierror.New(http.StatusForbidden, "repository_not_covered",
					fmt.Sprintf("installation %s does not cover repository %s; nothing was fetched", id, repo))
			}
			return in.Tenant, "installation " + id, nil
		}
		via = "installation " + id + " and "
	}
	via += "repository " + repo
	if l.Repository == nil {
		return store.Tenant{}, via, apierror.New(http.StatusNotFound, "unknown_installation", via+" is not linked to a tenant")
	}
	return l.Repository.Tenant, "repository " + repo, nil
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
