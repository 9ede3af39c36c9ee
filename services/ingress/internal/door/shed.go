package door

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// ShedConfig is how ingress refuses work the cell could not serve in time.
type ShedConfig struct {
	// Off turns capacity admission off: interactive work is queued
	// whatever the wait (the tenant's rate still applies).
	Off bool
	// QueueWait is the longest predicted queue wait interactive work is
	// admitted into. Default: a tenth of the time its deadline leaves
	// (800ms of an 8s deadline, 60s of the default 10m), so most of the
	// deadline stays for the call, its retries and the gate; the deadline
	// less the time a call needs bounds it in any case.
	QueueWait time.Duration
	// BatchBacklog and InteractiveBacklog bound each tenant's work queued
	// or running in a lane; what would take it past them gets 429
	// backlog_full (a webhook is dropped). Defaults 10000 and 1000.
	BatchBacklog, InteractiveBacklog int
	// RetryAfterMax caps the Retry-After of a capacity or backlog
	// refusal (a refusal's Retry-After is never past the work's deadline
	// either). Default 60s.
	RetryAfterMax time.Duration
	// LocalRate keeps each tenant's rate per ingress instance instead of
	// shared by every instance of the cell through NATS.
	LocalRate bool
}

func (c *ShedConfig) defaults() error {
	if c.QueueWait < 0 {
		return fmt.Errorf("ingress: Shed.QueueWait %v is negative", c.QueueWait)
	}
	if c.BatchBacklog == 0 {
		c.BatchBacklog = 10000
	}
	if c.BatchBacklog < 0 {
		return fmt.Errorf("ingress: Shed.BatchBacklog %d is negative", c.BatchBacklog)
	}
	if c.InteractiveBacklog == 0 {
		c.InteractiveBacklog = 1000
	}
	if c.InteractiveBacklog < 0 {
		return fmt.Errorf("ingress: Shed.InteractiveBacklog %d is negative", c.InteractiveBacklog)
	}
	if c.RetryAfterMax == 0 {
		c.RetryAfterMax = time.Minute
	}
	if c.RetryAfterMax < time.Second {
		return fmt.Errorf("ingress: Shed.RetryAfterMax %v is under a second", c.RetryAfterMax)
	}
	return nil
}

// shedVars are the settings fromEnv reads.
var shedVars = []config.Var{
	{Name: "ASSAY_SHED", Default: "on", Usage: "on: refuse interactive work the cell could not start within ASSAY_SHED_QUEUE_WAIT; off: queue it"},
	{Name: "ASSAY_SHED_QUEUE_WAIT", Default: "a tenth of the deadline", Usage: "the longest predicted queue wait interactive work is admitted into"},
	{Name: "ASSAY_BATCH_BACKLOG", Default: "10000", Usage: "batch work a tenant may have queued or running, however it came (work, batches)"},
	{Name: "ASSAY_INTERACTIVE_BACKLOG", Default: "1000", Usage: "interactive work a tenant may have queued or running, however it came (work, webhooks)"},
	{Name: "ASSAY_INGRESS_RATE", Default: "shared", Usage: "shared: a tenant's rate holds across the cell's ingress instances (NATS KV); local: per instance"},
	{Name: "ASSAY_SHED_RETRY_AFTER_MAX", Default: "60s", Usage: "the longest Retry-After a capacity or backlog refusal gives (never past the work's deadline either)"},
}

// backlog is the lane's backlog limit.
func (c *ShedConfig) backlog(lane string) int {
	if lane == event.Batch {
		return c.BatchBacklog
	}
	return c.InteractiveBacklog
}

func (c *ShedConfig) fromEnv(getenv func(string) string) error {
	if err := config.Choices(getenv, config.Choice{Name: "ASSAY_SHED", Default: "on", Other: "off", To: &c.Off}); err != nil {
		return err
	}
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_SHED_QUEUE_WAIT", To: &c.QueueWait, Min: 10 * time.Millisecond, Max: time.Hour},
		config.Duration{Name: "ASSAY_SHED_RETRY_AFTER_MAX", To: &c.RetryAfterMax, Min: time.Second, Max: time.Hour},
	); err != nil {
		return err
	}
	if err := config.Int(getenv, "ASSAY_BATCH_BACKLOG", &c.BatchBacklog, 1, 10_000_000); err != nil {
		return err
	}
	if err := config.Int(getenv, "ASSAY_INTERACTIVE_BACKLOG", &c.InteractiveBacklog, 1, 10_000_000); err != nil {
		return err
	}
	return config.Choices(getenv, config.Choice{Name: "ASSAY_INGRESS_RATE", Default: "shared", Other: "local", To: &c.LocalRate})
}

// OpenCounter is the store's bounded count of a tenant's open work in a
// lane.
type OpenCounter interface {
	OpenWork(ctx context.Context, tenantID, lane string, limit int) (int, error)
}

// shedder is ingress's capacity admission: the cell's capacity as its
// classifiers report it, what this instance admitted since, and the shared
// rate buckets.
type shedder struct {
	cfg     ShedConfig
	view    *capacityView
	open    OpenCounter
	shared  *sharedRate
	counted metric.Int64Counter // assay_shed
}

func (s *Door) SetUpShed() error {
	sh := &shedder{cfg: s.Cfg.Shed}
	sh.view = &capacityView{js: s.D.JS, bucket: s.Cfg.Names.CapacityBucket(), log: s.D.Log}
	sh.open = s.D.Store
	if !sh.cfg.LocalRate {
		sh.shared = &sharedRate{js: s.D.JS, bucket: s.Cfg.Names.AdmitBucket(), streams: s.Cfg.Streams, log: s.D.Log,
			b: &admission.SharedBuckets{Local: s.Buckets}}
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
	s.Shed = sh
	return nil
}

// CapacityKnown reports whether a fresh capacity report of the cell's
// classifiers has been read.
func (s *Door) CapacityKnown() bool {
	if s.Shed == nil {
		return false
	}
	s.Shed.view.mu.Lock()
	defer s.Shed.view.mu.Unlock()
	return s.Shed.view.load(time.Now()).Reports > 0
}

// take takes a token from the tenant's bucket for the lane: the cell's
// shared one, or this instance's.
func (s *Door) Take(ctx context.Context, t store.Tenant, lane string) (time.Duration, bool) {
	if s.Shed != nil && s.Shed.shared != nil {
		return s.Shed.shared.take(ctx, t, lane)
	}
	ok, wait := s.Buckets.Take(t.ID+"/"+lane, float64(t.RatePerMinute), t.Burst)
	return wait, ok
}

// Refusal is why capacity admission refused work, and when to ask again.
// reason is what the caller is told: of its own work only. detail is what
// the decision log adds for the operator: the lane's figures.
type Refusal struct {
	Code   string // over_capacity or backlog_full
	Reason string
	Detail string
	Retry  time.Duration
}

// deadlineShare: without a QueueWait, work may wait a tenth of its
// deadline. Predicted waits come out short by about a tenth at the tail
// (the served wait's p95 is that far over the wait admitted), which this
// leaves within an eighth.
const deadlineShare = 10

// shedDecision decides whether interactive work predicted to wait p may
// be queued: the wait must fit within maxWait and within what the deadline
// leaves after the call needs its time. Unknown capacity admits, and so
// does a lane with nothing waiting in it. The Retry-After it gives is at
// most retryMax and never past the deadline.
func shedDecision(p admission.Prediction, maxWait, remaining, need, retryMax time.Duration) *Refusal {
	if !p.Known || p.Waiting <= 0 {
		return nil
	}
	if maxWait <= 0 {
		maxWait = remaining / deadlineShare
	}
	// The start must fit in its share of the deadline; the result, behind
	// the answers the committer has yet to commit, in the deadline itself.
	bound := min(maxWait, remaining-need-p.Downstream)
	if p.Wait <= bound {
		return nil
	}
	// When the wait will have drained; never later than the work could
	// wait at all (a cell whose served rate fell near zero for a moment,
	// a database failover, predicts waits of days).
	over := max(p.Wait-maxWait, p.Wait+p.Downstream+need-remaining)
	retry := min(max(over, time.Second), max(remaining, time.Second), max(retryMax, time.Second))
	reason := fmt.Sprintf("the cell is at capacity: this work would wait about %s before it starts, over the %s it can wait",
		p.Wait.Round(time.Millisecond), max(bound, 0).Round(time.Millisecond))
	if p.Wait <= maxWait {
		reason = fmt.Sprintf("the cell is at capacity: this work's result would come after its deadline (%s to start, %s behind the results being committed)",
			p.Wait.Round(time.Millisecond), p.Downstream.Round(time.Millisecond))
	}
	return &Refusal{Code: "over_capacity", Retry: retry, Reason: reason,
		Detail: fmt.Sprintf("%.0f waiting in the lane, %.0f of them this tenant's, at %.1f/s served, %s to commit what is answered",
			p.Waiting, p.Ahead, p.Rate, p.Downstream.Round(time.Millisecond))}
}

// admitCapacity decides whether the cell can take w now: the tenant's
// backlog in w's lane must have room for it, and interactive work must be
// predicted to start within what it can wait.
func (s *Door) AdmitCapacity(ctx context.Context, t store.Tenant, w *store.Work) *Refusal {
	sh := s.Shed
	if sh == nil || sh.cfg.Off {
		return nil
	}
	// The prediction first: it costs no round trip, and under overload it
	// refuses most of what comes.
	if w.Lane != event.Batch {
		now := time.Now()
		p, latency := sh.view.predict(w.Lane, t.ID, now)
		need := 2*latency + 500*time.Millisecond
		if r := shedDecision(p, sh.cfg.QueueWait, w.DeadlineAt.Sub(now), need, sh.cfg.RetryAfterMax); r != nil {
			return r
		}
	}
	if r := s.AdmitBacklog(ctx, t, w.Lane, 1); r != nil {
		return r
	}
	sh.view.admitted(w.Lane, t.ID)
	return nil
}

// admitBacklog is the one backlog rule, for every way work enters (a
// submission, a batch of n items, a webhook): the tenant's work queued or
// running in the lane, with the n this would add, stays within the
// lane's limit.
func (s *Door) AdmitBacklog(ctx context.Context, t store.Tenant, lane string, n int) *Refusal {
	sh := s.Shed
	if sh == nil || sh.cfg.Off {
		return nil
	}
	limit := sh.cfg.backlog(lane)
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
	if rate := sh.view.rate(time.Now()); rate > 0 {
		retry = min(max(time.Second, time.Duration(float64(time.Second)*float64(open+n-limit)/rate)), sh.cfg.RetryAfterMax)
	}
	what := "this work"
	if n > 1 {
		what = fmt.Sprintf("these %d items", n)
	}
	return &Refusal{Code: "backlog_full", Retry: retry,
		Reason: fmt.Sprintf("the tenant's %s-lane backlog is full: %d work items queued or running, and %s would take it past its limit of %d",
			lane, open, what, limit)}
}

// overCapacity answers a submission capacity admission refused: 429 with
// Retry-After, nothing stored; a key already accepted answers as the
// duplicate it is.
func (s *Door) OverCapacity(ctx context.Context, w http.ResponseWriter, t store.Tenant, work *store.Work, r *Refusal) {
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

func (s *Door) CountShed(ctx context.Context, lane, code, via string) {
	if s.Shed == nil {
		return
	}
	s.Shed.counted.Add(ctx, 1, metric.WithAttributes(attribute.String("region", s.Cfg.Region),
		attribute.String("lane", lane), attribute.String("reason", code), attribute.String("via", via)))
}

// capacityView is the cell's capacity as its classifier instances report
// it in the capacity bucket, watched, with what this instance admitted
// since the last report. A lifecycle part.
type capacityView struct {
	js     jetstream.KeyValueManager
	bucket string
	log    *slog.Logger
	run    lifecycle.Runner

	mu      sync.Mutex
	reports map[string]admission.CapacityReport
	newest  time.Time
	extra   map[string]float64    // lane -> admitted since the newest report
	extraT  map[[2]string]float64 // lane, tenant -> the same
}

func (v *capacityView) Start(ctx context.Context) error { return v.run.Go(ctx, v.loop) }

func (v *capacityView) Stop(ctx context.Context) { v.run.Stop(ctx) }

// loop watches the bucket; it waits for the bucket to exist (the
// classifier makes it) and watches again when a watch ends.
func (v *capacityView) loop(ctx context.Context) {
	warned := false
	for ctx.Err() == nil {
		if err := v.watch(ctx); err != nil && ctx.Err() == nil && !warned && !errors.Is(err, jetstream.ErrBucketNotFound) {
			v.log.Warn("capacity bucket not watched; interactive work is admitted without a capacity check until it is", "bucket", v.bucket, "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (v *capacityView) watch(ctx context.Context) error {
	kv, err := v.js.KeyValue(ctx, v.bucket)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("capacity watch ended")
			}
			if e == nil {
				continue // the values present at the start are all in
			}
			v.apply(e)
		}
	}
}

func (v *capacityView) apply(e jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.reports == nil {
		v.reports = map[string]admission.CapacityReport{}
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(v.reports, e.Key())
		return
	}
	var r admission.CapacityReport
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		v.log.Warn("undecodable capacity report", "key", e.Key(), "err", err)
		return
	}
	v.reports[e.Key()] = r
	if r.At.After(v.newest) {
		v.newest = r.At
	}
	// What this instance admitted before the report is in it now.
	v.extra, v.extraT = nil, nil
}

func (v *capacityView) load(now time.Time) admission.CellLoad {
	rs := make([]admission.CapacityReport, 0, len(v.reports))
	for k, r := range v.reports {
		if !r.Fresh(now) {
			delete(v.reports, k)
			continue
		}
		rs = append(rs, r)
	}
	return admission.Combine(rs, now)
}

// predict predicts the queue wait of one more item of tenant in lane, and
// returns the cell's call latency.
func (v *capacityView) predict(lane, tenant string, now time.Time) (admission.Prediction, time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := v.load(now)
	return l.Predict(lane, tenant, 1, now.Sub(v.newest), v.extra[lane], v.extraT[[2]string{lane, tenant}]), l.Latency
}

func (v *capacityView) rate(now time.Time) float64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.load(now).ServiceRate()
}

func (v *capacityView) admitted(lane, tenant string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.extra == nil {
		v.extra, v.extraT = map[string]float64{}, map[[2]string]float64{}
	}
	v.extra[lane]++
	v.extraT[[2]string{lane, tenant}]++
}

// sharedRate is the cell's tenant buckets in its admission bucket, opened
// (made when missing) on first use; while it cannot be, takes fall back
// to this instance's buckets, and that is logged at most once a minute.
type sharedRate struct {
	js     jetstream.KeyValueManager
	bucket string
	// streams are the cell's stream settings, whose replicas and
	// placement the bucket takes.
	streams event.StreamSettings
	log     *slog.Logger
	b       *admission.SharedBuckets

	mu       sync.Mutex
	tried    time.Time
	warnedAt time.Time
}

func (r *sharedRate) take(ctx context.Context, t store.Tenant, lane string) (time.Duration, bool) {
	if !r.open(ctx) {
		ok, wait := r.b.Local.Take(t.ID+"/"+lane, float64(t.RatePerMinute), t.Burst)
		return wait, ok
	}
	ok, wait, err := r.b.Take(ctx, event.AdmitKey(t.ID, lane), float64(t.RatePerMinute), t.Burst)
	if err != nil {
		r.warn("shared rate bucket failed; the tenant's rate holds per instance until it answers", err)
	}
	return wait, ok
}

func (r *sharedRate) open(ctx context.Context) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b.KV != nil {
		return true
	}
	if time.Since(r.tried) < 5*time.Second {
		return false
	}
	r.tried = time.Now()
	octx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// A request waits for one try: a later one asks again.
	kv, err := event.EnsureBucket(octx, r.js, r.log, jetstream.KeyValueConfig{Bucket: r.bucket,
		Description: "the cell's ingress token buckets, one per tenant and lane, shared by its ingress instances",
		History:     1, Storage: jetstream.MemoryStorage}, r.streams.Once())
	if err != nil {
		r.warnLocked("shared rate bucket not opened; the tenant's rate holds per instance until it is", err)
		return false
	}
	r.b.KV = kv
	return true
}

func (r *sharedRate) warn(msg string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warnLocked(msg, err)
}

func (r *sharedRate) warnLocked(msg string, err error) {
	if time.Since(r.warnedAt) < time.Minute {
		return
	}
	r.warnedAt = time.Now()
	r.log.Warn(msg, "bucket", r.bucket, "err", err)
}
