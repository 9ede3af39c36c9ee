package door

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/ingress/internal/shed"
)

// OpenCounter is the store's bounded count of a tenant's open work in a
// lane.
type OpenCounter interface {
	OpenWork(ctx context.Context, tenantID, lane string, limit int) (int, error)
}

// shedder is ingress's capacity admission: the cell's capacity as its
// classifiers report it, what this instance admitted since, and the shared
// rate buckets.
type shedder struct {
	cfg     shed.Config
	view    *shed.View
	open    OpenCounter
	shared  *shed.SharedRate
	counted metric.Int64Counter // assay_shed
}

// setUpShed builds capacity admission and its counter, assay_shed.
func (s *Door) setUpShed() error {
	sh := &shedder{cfg: s.Cfg.Shed}
	sh.view = &shed.View{JS: s.D.JS, Bucket: s.Cfg.Names.CapacityBucket(), Log: s.D.Log}
	sh.open = s.D.Store
	if !sh.cfg.LocalRate {
		sh.shared = &shed.SharedRate{JS: s.D.JS, Bucket: s.Cfg.Names.AdmitBucket(), Streams: s.Cfg.Streams, Log: s.D.Log,
			B: &admission.SharedBuckets{Local: s.buckets}}
	}
	var err error
	sh.counted, err = s.D.Tel.Meter().Int64Counter("assay_shed",
		metric.WithDescription("submissions ingress refused for the cell's capacity or the tenant's batch backlog, by lane, why and how they came"))
	if err != nil {
		return err
	}
	region := attribute.String("region", s.Cfg.Region)
	for _, lane := range event.Lanes { // at zero from the start, like assay_dropped
		for _, via := range []string{"api", "webhook"} {
			for _, why := range []string{"over_capacity", "backlog_full"} {
				sh.counted.Add(context.Background(), 0, metric.WithAttributes(region, attribute.String("lane", lane),
					attribute.String("reason", why), attribute.String("via", via)))
			}
		}
		s.Dropped.Add(context.Background(), 0, metric.WithAttributes(region, attribute.String("lane", lane),
			attribute.String("reason", "over_capacity")))
	}
	s.shed = sh
	return nil
}

// CapacityKnown reports whether a fresh capacity report of the cell's
// classifiers has been read.
func (s *Door) CapacityKnown() bool {
	if s.shed == nil {
		return false
	}
	return s.shed.view.Known()
}

// Take takes a token from the tenant's bucket for the lane: the cell's
// shared one, or this instance's.
func (s *Door) Take(ctx context.Context, t store.Tenant, lane string) (time.Duration, bool) {
	if s.shed != nil && s.shed.shared != nil {
		return s.shed.shared.Take(ctx, t, lane)
	}
	ok, wait := s.buckets.Take(t.ID+"/"+lane, float64(t.RatePerMinute), t.Burst)
	return wait, ok
}

// AdmitCapacity decides whether the cell can take w now: the tenant's
// backlog in w's lane must have room for it, and interactive work must be
// predicted to start within what it can wait.
func (s *Door) AdmitCapacity(ctx context.Context, t store.Tenant, w *store.Work) *shed.Refusal {
	sh := s.shed
	if sh == nil || sh.cfg.Off {
		return nil
	}
	// The prediction first: it costs no round trip, and under overload it
	// refuses most of what comes.
	if w.Lane != event.Batch {
		now := time.Now()
		p, latency := sh.view.Predict(w.Lane, t.ID, now)
		need := 2*latency + 500*time.Millisecond
		if r := shed.Decide(p, sh.cfg.QueueWait, w.DeadlineAt.Sub(now), need, sh.cfg.RetryAfterMax); r != nil {
			return r
		}
	}
	if r := s.AdmitBacklog(ctx, t, w.Lane, 1); r != nil {
		return r
	}
	sh.view.Admitted(w.Lane, t.ID)
	return nil
}

// AdmitBacklog is the one backlog rule, for every way work enters (a
// submission, a batch of n items, a webhook): the tenant's work queued or
// running in the lane, with the n this would add, stays within the
// lane's limit.
func (s *Door) AdmitBacklog(ctx context.Context, t store.Tenant, lane string, n int) *shed.Refusal {
	sh := s.shed
	if sh == nil || sh.cfg.Off {
		return nil
	}
	limit := sh.cfg.Backlog(lane)
	open, err := sh.open.OpenWork(ctx, t.ID, lane, limit)
	if err != nil {
		// The insert that follows meets the same database; let it answer.
		s.D.Log.WarnContext(ctx, "backlog count failed", "tenant", t.ID, "lane", lane, "err", err)
		return nil
	}
	if open+n <= limit {
		return nil
	}
	retry := sh.cfg.RetryAfterMax
	if rate := sh.view.Rate(time.Now()); rate > 0 {
		retry = min(max(time.Second, time.Duration(float64(time.Second)*float64(open+n-limit)/rate)), sh.cfg.RetryAfterMax)
	}
	what := "this work"
	if n > 1 {
		what = fmt.Sprintf("these %d items", n)
	}
	return &shed.Refusal{Code: "backlog_full", Retry: retry,
		Reason: fmt.Sprintf("the tenant's %s-lane backlog is full: %d work items queued or running, and %s would take it past its limit of %d",
			lane, open, what, limit)}
}

// OverCapacity answers a submission capacity admission refused: 429 with
// Retry-After, nothing stored; a key already accepted answers as the
// duplicate it is.
func (s *Door) OverCapacity(ctx context.Context, w http.ResponseWriter, t store.Tenant, work *store.Work, r *shed.Refusal) {
	if got, err := s.D.Store.GetWork(ctx, work.ID); err == nil && got.State != outcome.Dropped {
		s.Duplicate(ctx, w, t, got)
		return
	}
	s.Count(ctx, r.Code)
	s.CountShed(ctx, work.Lane, r.Code, "api")
	telemetry.Decision(ctx, s.D.Log, work.ID, "refused", r.Reason, slog.String("tenant", t.ID), slog.String("lane", work.Lane),
		slog.Duration("retry_after", r.Retry), slog.String("detail", r.Detail))
	TooMany(w, r.Code, r.Reason, r.Retry)
}

// CountShed counts a submission refused for the cell's capacity or the
// tenant's backlog (assay_shed), by lane, code and the way it came.
func (s *Door) CountShed(ctx context.Context, lane, code, via string) {
	if s.shed == nil {
		return
	}
	s.shed.counted.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.Cfg.Region),
		attribute.String("lane", lane), attribute.String("reason", code), attribute.String("via", via)))
}
