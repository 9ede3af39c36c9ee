package batches

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
	"assay.dev/services/ingress/internal/shed"
)

// Batch limits.
const (
	// MaxBatchItems is the most items one batch holds.
	MaxBatchItems = api.MaxBatchItems
	// maxBatchBody caps a batch request's body: the HTTP host's own cap.
	maxBatchBody = 4 << 20
	// batchNamed is the most items GET /v1/batches/{id} names per list;
	// the results stream names every one.
	batchNamed = 1000
)

func batchLinks(id string) api.BatchLinks {
	p := "/v1/batches/" + id
	return api.BatchLinks{Self: p, Results: p + "/results", Events: p + "/events", Cancel: p + "/cancel"}
}

func itemView(it store.BatchItem) api.BatchItemView {
	v := api.BatchItemView{ItemID: it.ItemID, WorkID: it.WorkID, State: it.State, Reason: it.Reason, Output: it.Output}
	if outcome.IsTerminal(it.State) {
		o := it.State
		v.Outcome = &o
	}
	return v
}

var (
	batchKeyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)
	batchIDRE  = regexp.MustCompile(`^b_[0-9a-f]{24}$`)
)

// submitBatch serves POST /v1/batches: every item becomes batch-lane work
// through the ingress fence, and the manifest names each by its item id,
// all in one transaction. The batch takes one token of the tenant's batch
// lane bucket.
func (s *Room) submitBatch(w http.ResponseWriter, r *http.Request) {
	ctx, span := s.D.Tel.Tracer().Start(telemetry.FromCaller(r.Context(), r.Header), "ingress.batch")
	defer span.End()
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	// The rate token first, a repeated batchKey's too: a refused request
	// costs no reading of its body.
	if wait, ok := s.Take(ctx, t, event.Batch); !ok {
		door.TooMany(w, "rate_limited", door.OverRate(t, event.Batch), wait)
		return
	}
	req, c, refused := s.decodeBatch(w, r)
	if refused != nil {
		refused.Write(w)
		return
	}
	c, _ = s.ContractFor(ctx, t.ID, c)
	deadline := batchDeadline(time.Now(), req.DeadlineSeconds, s.Cfg.BatchDeadline)
	b := &store.Batch{ID: batchID(t.ID, req.BatchKey), TenantID: t.ID, Contract: c.Name, ItemsDigest: itemsDigest(req),
		DeadlineAt: deadline}
	known := false
	if req.BatchKey != "" {
		_, err := s.D.Store.GetBatch(ctx, t.ID, b.ID)
		known = err == nil
	}
	// A batch asked for again is answered as the one it is; a new one
	// must fit in the tenant's backlog with all its items.
	if r := s.newBatchBacklog(ctx, t, known, len(req.Items)); r != nil {
		s.CountShed(ctx, event.Batch, r.Code, "api")
		telemetry.Decision(ctx, s.D.Log, b.ID, "refused", r.Reason, slog.String("tenant", t.ID), slog.Int("items", len(req.Items)))
		door.TooMany(w, r.Code, r.Reason, r.Retry)
		return
	}
	entries := s.batchEntries(ctx, t, c, req.Items, deadline)
	got, created, err := s.D.Store.InsertBatch(ctx, b, entries, s.Announcer(ctx))
	if s.insertRefused(w, err, b.ID, req.BatchKey) {
		return
	}
	resp := api.BatchResponse{BatchID: got.ID, Contract: got.Contract, Total: got.ItemCount, Duplicate: !created,
		Region: s.Cfg.Region, Links: batchLinks(got.ID)}
	if !created {
		telemetry.Decision(ctx, s.D.Log, got.ID, "duplicate", "batch key already accepted", slog.String("tenant", t.ID))
		apierror.JSON(w, http.StatusOK, resp)
		return
	}
	s.Relay.Kick()
	resp.Items = s.batchQueued(ctx, t, got.ID, entries)
	telemetry.Decision(ctx, s.D.Log, got.ID, "batch_accepted", fmt.Sprintf("%d items", got.ItemCount), slog.String("tenant", t.ID))
	apierror.JSON(w, http.StatusAccepted, resp)
}

// batchDeadline is the deadline of a batch's items asked for at now: its
// own, when the request gives seconds, or the batch lane's.
func batchDeadline(now time.Time, seconds int, lane time.Duration) time.Time {
	if seconds > 0 {
		return now.Add(time.Duration(seconds) * time.Second)
	}
	return now.Add(lane)
}

// batchEntries are the manifest's entries of a batch's items, each with
// the batch-lane work it is to become.
func (s *Room) batchEntries(ctx context.Context, t store.Tenant, c *contract.Contract, items []api.BatchItemRequest,
	deadline time.Time) []*store.BatchEntry {
	entries := make([]*store.BatchEntry, len(items))
	for i, it := range items {
		entries[i] = &store.BatchEntry{ItemID: it.ItemID,
			Work: s.NewWork(ctx, t, c, it.SourceID, it.Revision, event.Batch, request.Compact(it.Input), deadline)}
	}
	return entries
}

// insertRefused answers a batch the database did not store (err), and
// is false when it was stored.
func (s *Room) insertRefused(w http.ResponseWriter, err error, id, key string) bool {
	switch {
	case errors.Is(err, store.ErrBatchConflict):
		apierror.Write(w, http.StatusConflict, "batch_key_reused",
			fmt.Sprintf("batchKey %q names a batch with other items; use a new key for new items", key))
	case store.Permanent(err):
		s.D.Log.Warn("batch refused by the database", "key", id, "sqlstate", store.SQLState(err))
		apierror.Write(w, http.StatusBadRequest, "invalid_input",
			fmt.Sprintf("the cell cannot store this batch: %s; nothing was stored", store.Refusal(err)))
	case err != nil:
		s.D.Log.Error("insert batch failed", "key", id, "err", err)
		apierror.Write(w, http.StatusServiceUnavailable, "unavailable", "the batch was not stored; try again")
	default:
		return false
	}
	return true
}

// batchQueued follows a new batch's entries: it starts the shadows of the
// work they created, logs each new item's decision, and is the items of
// the answer.
func (s *Room) batchQueued(ctx context.Context, t store.Tenant, batchID string, entries []*store.BatchEntry) []api.BatchItemWork {
	var made []*store.Work
	for _, e := range entries {
		if e.Created {
			made = append(made, e.Work)
		}
	}
	s.GoShadow(ctx, made...)
	var items []api.BatchItemWork
	for _, e := range entries {
		items = append(items, api.BatchItemWork{ItemID: e.ItemID, WorkID: e.Got.ID, State: e.Got.State, Existing: !e.Created})
		if e.Created {
			s.LogSuperseded(ctx, e.Got)
			telemetry.Decision(ctx, s.D.Log, e.Got.ID, outcome.Queued, "new ingress key in batch "+batchID,
				slog.String("tenant", t.ID), telemetry.OpaqueAttr("item", e.ItemID))
		}
	}
	return items
}

// newBatchBacklog is the backlog rule for a batch of n items; a batch
// asked for again (known) adds nothing.
func (s *Room) newBatchBacklog(ctx context.Context, t store.Tenant, known bool, n int) *shed.Refusal {
	if known {
		return nil
	}
	return s.AdmitBacklog(ctx, t, event.Batch, n)
}

// batchID is the batch's id: from the tenant and its batch key when there
// is one, so a retried request names the same batch; otherwise random.
func batchID(tenant, key string) string {
	if key == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		return "b_" + hex.EncodeToString(b[:])
	}
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return "b_" + hex.EncodeToString(h.Sum(nil))[:24]
}

// itemsDigest tells a retry of a request from other items under one key.
func itemsDigest(req api.BatchRequest) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00", req.Contract, req.DeadlineSeconds)
	for _, it := range req.Items {
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", it.ItemID, it.SourceID, it.Revision, request.Compact(it.Input))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// decodeBatch reads a batch strictly and validates every item; the first
// refusal says which item and why. Nothing of a refused batch is stored.
func (s *Room) decodeBatch(w http.ResponseWriter, r *http.Request) (api.BatchRequest, *contract.Contract, *apierror.Error) {
	var req api.BatchRequest
	bad := func(code, msg string) (api.BatchRequest, *contract.Contract, *apierror.Error) {
		return req, nil, apierror.New(http.StatusBadRequest, code, msg)
	}
	if refused, err := request.DecodeBody(w, r, maxBatchBody, &req); refused != nil {
		var many *request.TooManyError
		if errors.As(err, &many) && many.Path == "items" {
			return bad("too_many_items", fmt.Sprintf("a batch holds at most %d items; this one has more", MaxBatchItems))
		}
		return req, nil, refused
	}
	c, ok := s.D.Contracts.Get(req.Contract)
	switch {
	case !ok:
		return bad("unknown_contract", fmt.Sprintf("contract %q is not known (known: %s)", req.Contract, strings.Join(s.D.Contracts.Names(), ", ")))
	case req.BatchKey != "" && !batchKeyRE.MatchString(req.BatchKey):
		return bad("invalid_batch_key", "batchKey must be 1-100 characters of letters, digits and ._:-")
	case req.DeadlineSeconds < 0 || req.DeadlineSeconds > 7*24*3600:
		return bad("invalid_deadline", "deadlineSeconds must be between 1 and 604800")
	case len(req.Items) == 0:
		return bad("no_items", "items is required: at least one item")
	case len(req.Items) > MaxBatchItems:
		return bad("too_many_items", fmt.Sprintf("a batch holds at most %d items; this one has %d", MaxBatchItems, len(req.Items)))
	}
	items := map[string]int{}
	sources := map[string]int{}
	for i := range req.Items {
		it := &req.Items[i]
		at := fmt.Sprintf("items[%d]", i)
		if !door.SourceRE.MatchString(it.ItemID) {
			return bad("invalid_item_id", at+": itemId must be 1-200 characters of letters, digits and ._/#:@+-")
		}
		at += fmt.Sprintf(" (itemId %s)", it.ItemID)
		if j, dup := items[it.ItemID]; dup {
			return bad("duplicate_item_id", fmt.Sprintf("%s: itemId is items[%d]'s too; every itemId is unique in its batch", at, j))
		}
		items[it.ItemID] = i
		if len(it.Input) == 0 {
			return bad("invalid_input", at+": input is required")
		}
		if err := c.ValidateInput(it.Input); err != nil {
			return bad("invalid_input", at+": "+err.Error())
		}
		if refused := s.DiffSize(c, it.Input); refused != nil {
			refused.Message = at + ": " + refused.Message
			return api.BatchRequest{}, nil, refused
		}
		if it.SourceID == "" {
			it.SourceID = it.ItemID
		}
		if it.Revision == "" {
			it.Revision = "in-" + strings.TrimPrefix(api.Digest(request.Compact(it.Input)), "sha256:")[:16]
		}
		switch {
		case !door.SourceRE.MatchString(it.SourceID):
			return bad("invalid_source_id", at+": sourceId must be 1-200 characters of letters, digits and ._/#:@+-")
		case !door.RevisionRE.MatchString(it.Revision):
			return bad("invalid_revision", at+": revision must be 1-100 characters of letters, digits and ._-")
		}
		// Two items of one source would be one work item, or one would
		// supersede the other: neither is what a manifest means.
		if j, dup := sources[it.SourceID]; dup {
			return bad("duplicate_source", fmt.Sprintf("%s: sourceId %s is items[%d]'s too", at, it.SourceID, j))
		}
		sources[it.SourceID] = i
	}
	return req, c, nil
}

// tenantBatch authenticates the caller and reads its batch named in the
// path, or writes the refusal. Another tenant's batch is no batch.
func (s *Room) tenantBatch(w http.ResponseWriter, r *http.Request) (store.Tenant, *store.Batch, bool) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return t, nil, false
	}
	id := r.PathValue("id")
	if !batchIDRE.MatchString(id) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no batch with that id for this tenant")
		return t, nil, false
	}
	b, err := s.D.Store.GetBatch(r.Context(), t.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no batch with that id for this tenant")
		return t, nil, false
	}
	if err != nil {
		s.D.Log.Error("read batch failed", "key", id, "err", err)
		auth.Unavailable().Write(w)
		return t, nil, false
	}
	return t, b, true
}

func (s *Room) getBatch(w http.ResponseWriter, r *http.Request) {
	_, b, ok := s.tenantBatch(w, r)
	if !ok {
		return
	}
	v, err := batchView(r.Context(), s.D.Store, b)
	if err != nil {
		s.D.Log.Error("read batch failed", "key", b.ID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	apierror.JSON(w, http.StatusOK, v)
}

// batchView counts a batch's items per state and names those without a
// result, from one snapshot.
func batchView(ctx context.Context, bs door.BatchStore, b *store.Batch) (*api.BatchView, error) {
	o, err := bs.BatchOverview(ctx, b.ID, batchNamed)
	if err != nil {
		return nil, err
	}
	v := &api.BatchView{BatchID: b.ID, Contract: b.Contract, Total: b.ItemCount, Counts: map[string]int{},
		DeadlineAt: b.DeadlineAt, CreatedAt: b.CreatedAt, FailedItems: []api.BatchItemView{}, PendingItems: []api.BatchItemView{},
		Links: batchLinks(b.ID)}
	for _, st := range outcome.WorkStates {
		v.Counts[st] = o.Counts[st]
	}
	named := 0
	for st, n := range o.Counts {
		named += n
		switch {
		case st == outcome.Accepted:
			v.Accepted += n
		case outcome.IsTerminal(st):
			v.Failed += n
		case st == outcome.Queued || st == outcome.Running:
			v.Pending += n
		default:
			v.Missing += n
		}
	}
	// Items the manifest counts but whose rows are not there.
	v.Missing += max(0, b.ItemCount-named)
	v.Complete = v.Pending == 0 && v.Missing == 0
	if !b.CanceledAt.IsZero() {
		at := b.CanceledAt.UTC()
		v.Canceled, v.CanceledAt = true, &at
	}
	for _, l := range []struct {
		from []store.BatchItem
		to   *[]api.BatchItemView
	}{{o.Failed, &v.FailedItems}, {o.Pending, &v.PendingItems}} {
		if len(l.from) > batchNamed {
			l.from, v.Truncated = l.from[:batchNamed], true
		}
		for _, it := range l.from {
			*l.to = append(*l.to, itemView(it))
		}
	}
	return v, nil
}

// batchResults serves GET /v1/batches/{id}/results: one JSON line per
// item, in item id order (bytewise), with the accepted output or the
// outcome and reason; items with no outcome yet say their state. It is
// read and written a page at a time.
func (s *Room) batchResults(w http.ResponseWriter, r *http.Request) {
	_, b, ok := s.tenantBatch(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	rc := http.NewResponseController(w)
	const page = 500
	after := ""
	wrote := false
	for {
		items, err := s.D.Store.BatchItems(ctx, store.BatchItemFilter{BatchID: b.ID, After: after, WithOutput: true, Limit: page})
		if err != nil {
			if !wrote {
				s.D.Log.Error("read batch results failed", "key", b.ID, "err", err)
				auth.Unavailable().Write(w)
			}
			// Once lines were written the status is sent: the cut-off
			// stream is the error (its line count is short of total).
			return
		}
		if !wrote {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "no-store")
			w.Header().Set("X-Batch-Total", strconv.Itoa(b.ItemCount))
			w.WriteHeader(http.StatusOK)
			wrote = true
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for _, it := range items {
			_ = enc.Encode(itemView(it))
		}
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		_ = rc.Flush()
		if len(items) < page {
			return
		}
		after = items[len(items)-1].ItemID
	}
}

// cancelBatch serves POST /v1/batches/{id}/cancel (and DELETE
// /v1/batches/{id}): the batch's items that have no outcome yet end
// canceled, and running model calls are told to stop. Canceling again is
// harmless and answers the batch as it stands.
func (s *Room) cancelBatch(w http.ResponseWriter, r *http.Request) {
	t, b, ok := s.tenantBatch(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	reason := "batch " + b.ID + " was canceled"
	got, ended, err := s.D.Store.CancelBatch(ctx, t.ID, b.ID, func(items []store.CanceledItem) ([]store.OutboxMsg, error) {
		var msgs []store.OutboxMsg
		for _, it := range items {
			if !it.Running {
				continue
			}
			m, err := outbox.Msg(ctx, event.KindWork, s.Cfg.Names.Cancel(t.ID), "cancel."+it.WorkID+"."+b.ID,
				event.Cancel{WorkID: it.WorkID, TenantID: t.ID, Region: s.Cfg.Region, Reason: reason})
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, m)
		}
		return msgs, nil
	})
	if err != nil {
		s.D.Log.Error("cancel batch failed", "key", b.ID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	s.Relay.Kick()
	for _, it := range ended {
		telemetry.Decision(ctx, s.D.Log, it.WorkID, outcome.Canceled, reason, slog.String("tenant", t.ID))
	}
	v, err := batchView(ctx, s.D.Store, got)
	if err != nil {
		s.D.Log.Error("read batch failed", "key", b.ID, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	n := len(ended)
	v.CanceledItems = &n
	apierror.JSON(w, http.StatusOK, v)
}
