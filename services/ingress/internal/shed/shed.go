// Package shed is how ingress refuses work the cell could not serve in
// time: the cell's capacity as its classifiers report it, the decision
// it feeds, and the tenant rate buckets the cell's instances share.
package shed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/store"
)

// Config is how ingress refuses work the cell could not serve in time.
type Config struct {
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

// Defaults checks the settings and fills in what they leave unset.
func (c *Config) Defaults() error {
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

// Vars are the settings FromEnv reads.
var Vars = []config.Var{
	{Name: "ASSAY_SHED", Default: "on", Usage: "on: refuse interactive work the cell could not start within ASSAY_SHED_QUEUE_WAIT; off: queue it"},
	{Name: "ASSAY_SHED_QUEUE_WAIT", Default: "a tenth of the deadline", Usage: "the longest predicted queue wait interactive work is admitted into"},
	{Name: "ASSAY_BATCH_BACKLOG", Default: "10000", Usage: "batch work a tenant may have queued or running, however it came (work, batches)"},
	{Name: "ASSAY_INTERACTIVE_BACKLOG", Default: "1000", Usage: "interactive work a tenant may have queued or running, however it came (work, webhooks)"},
	{Name: "ASSAY_INGRESS_RATE", Default: "shared", Usage: "shared: a tenant's rate holds across the cell's ingress instances (NATS KV); local: per instance"},
	{Name: "ASSAY_SHED_RETRY_AFTER_MAX", Default: "60s", Usage: "the longest Retry-After a capacity or backlog refusal gives (never past the work's deadline either)"},
}

// Backlog is the lane's backlog limit.
func (c *Config) Backlog(lane string) int {
	if lane == event.Batch {
		return c.BatchBacklog
	}
	return c.InteractiveBacklog
}

// FromEnv reads the settings of Vars; errors name the variable.
func (c *Config) FromEnv(getenv func(string) string) error {
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

// Decide decides whether interactive work predicted to wait p may
// be queued: the wait must fit within maxWait and within what the deadline
// leaves after the call needs its time. Unknown capacity admits, and so
// does a lane with nothing waiting in it. The Retry-After it gives is at
// most retryMax and never past the deadline.
func Decide(p admission.Prediction, maxWait, remaining, need, retryMax time.Duration) *Refusal {
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

// View is the cell's capacity as its classifier instances report
// it in the capacity bucket, watched, with what this instance admitted
// since the last report. A lifecycle part.
type View struct {
	JS     jetstream.KeyValueManager
	Bucket string
	Log    *slog.Logger
	run    lifecycle.Runner

	mu      sync.Mutex
	reports map[string]admission.CapacityReport
	newest  time.Time
	extra   map[string]float64    // lane -> admitted since the newest report
	extraT  map[[2]string]float64 // lane, tenant -> the same
}

func (v *View) Start(ctx context.Context) error { return v.run.Go(ctx, v.loop) }

func (v *View) Stop(ctx context.Context) { v.run.Stop(ctx) }

// loop watches the bucket; it waits for the bucket to exist (the
// classifier makes it) and watches again when a watch ends.
func (v *View) loop(ctx context.Context) {
	warned := false
	for ctx.Err() == nil {
		if err := v.watch(ctx); err != nil && ctx.Err() == nil && !warned && !errors.Is(err, jetstream.ErrBucketNotFound) {
			v.Log.Warn("capacity bucket not watched; interactive work is admitted without a capacity check until it is", "bucket", v.Bucket, "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (v *View) watch(ctx context.Context) error {
	kv, err := v.JS.KeyValue(ctx, v.Bucket)
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

func (v *View) apply(e jetstream.KeyValueEntry) {
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
		v.Log.Warn("undecodable capacity report", "key", e.Key(), "err", err)
		return
	}
	v.reports[e.Key()] = r
	if r.At.After(v.newest) {
		v.newest = r.At
	}
	// What this instance admitted before the report is in it now.
	v.extra, v.extraT = nil, nil
}

// load combines the fresh reports; v.mu is held.
func (v *View) load(now time.Time) admission.CellLoad {
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

// Predict predicts the queue wait of one more item of tenant in lane, and
// returns the cell's call latency.
func (v *View) Predict(lane, tenant string, now time.Time) (admission.Prediction, time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := v.load(now)
	return l.Predict(lane, tenant, 1, now.Sub(v.newest), v.extra[lane], v.extraT[[2]string{lane, tenant}]), l.Latency
}

// Rate is the rate the cell's classifiers serve at, per second, as
// they last reported it.
func (v *View) Rate(now time.Time) float64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.load(now).ServiceRate()
}

// Admitted counts one item of tenant admitted into lane since the newest
// report.
func (v *View) Admitted(lane, tenant string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.extra == nil {
		v.extra, v.extraT = map[string]float64{}, map[[2]string]float64{}
	}
	v.extra[lane]++
	v.extraT[[2]string{lane, tenant}]++
}

// SharedRate is the cell's tenant buckets in its admission bucket, opened
// (made when missing) on first use; while it cannot be, takes fall back
// to this instance's buckets, and that is logged at most once a minute.
type SharedRate struct {
	JS     jetstream.KeyValueManager
	Bucket string
	// Streams are the cell's stream settings, whose replicas and
	// placement the bucket takes.
	Streams event.StreamSettings
	Log     *slog.Logger
	B       *admission.SharedBuckets

	mu       sync.Mutex
	tried    time.Time
	warnedAt time.Time
}

// Take takes a token from the tenant's shared bucket for the lane, or
// from this instance's while the shared one cannot be opened.
func (r *SharedRate) Take(ctx context.Context, t store.Tenant, lane string) (time.Duration, bool) {
	if !r.open(ctx) {
		ok, wait := r.B.Local.Take(t.ID+"/"+lane, float64(t.RatePerMinute), t.Burst)
		return wait, ok
	}
	ok, wait, err := r.B.Take(ctx, event.AdmitKey(t.ID, lane), float64(t.RatePerMinute), t.Burst)
	if err != nil {
		r.warn("shared rate bucket failed; the tenant's rate holds per instance until it answers", err)
	}
	return wait, ok
}

func (r *SharedRate) open(ctx context.Context) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.B.KV != nil {
		return true
	}
	if time.Since(r.tried) < 5*time.Second {
		return false
	}
	r.tried = time.Now()
	octx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// A request waits for one try: a later one asks again.
	kv, err := event.EnsureBucket(octx, r.JS, r.Log, jetstream.KeyValueConfig{Bucket: r.Bucket,
		Description: "the cell's ingress token buckets, one per tenant and lane, shared by its ingress instances",
		History:     1, Storage: jetstream.MemoryStorage}, r.Streams.Once())
	if err != nil {
		r.warnLocked("shared rate bucket not opened; the tenant's rate holds per instance until it is", err)
		return false
	}
	r.B.KV = kv
	return true
}

func (r *SharedRate) warn(msg string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warnLocked(msg, err)
}

func (r *SharedRate) warnLocked(msg string, err error) {
	if time.Since(r.warnedAt) < time.Minute {
		return
	}
	r.warnedAt = time.Now()
	r.Log.Warn(msg, "bucket", r.Bucket, "err", err)
}

// Known reports whether a fresh capacity report of the cell's classifiers
// has been read.
func (v *View) Known() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.load(time.Now()).Reports > 0
}
