package classifier

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// metrics are the classifier's series beside attempts and the limiter's
// gauges: where time goes, and why work was retried, refused or rejected.
type metrics struct {
	tel                       *telemetry.Provider
	region                    attribute.KeyValue
	queueWait, active, call   metric.Float64Histogram
	gateRejected, rateLimited metric.Int64Counter
	retries, budgetDenied     metric.Int64Counter
	onFactsClaims             metric.Int64Counter
	// The GenAI client metrics of the model calls (genai.go).
	tokenUsage genaiconv.ClientTokenUsage
	opDuration genaiconv.ClientOperationDuration
}

func newMetrics(tel *telemetry.Provider, region string) (*metrics, error) {
	m := &metrics{tel: tel, region: attribute.String("region", region)}
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := tel.Seconds(name, desc)
		errs = append(errs, err)
		return h
	}
	count := func(name, desc string) metric.Int64Counter {
		c, err := tel.Meter().Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	m.queueWait = hist("assay_queue_wait", "from work being queued (or its retry falling due) to its claim")
	m.active = hist("assay_active", "from a claim to the attempt's verdict: the model call and the gate")
	m.call = hist("assay_model_call", "one model call, by the attempt's outcome")
	m.gateRejected = count("assay_gate_rejections", "answers the gate refused, by check")
	m.rateLimited = count("assay_provider_rate_limited", "429 answers from the provider")
	m.retries = count("assay_retries", "attempts followed by another, by why")
	m.budgetDenied = count("assay_budget_denials", "attempts the tenant's budget could not cover")
	m.onFactsClaims = count("assay_claims_on_facts", "claims made on an announcement's facts without reading the work row, by result (claimed, or reread when the row was not as the facts said)")
	genai := tel.MeterFor(semconv.SchemaURL)
	var err error
	m.tokenUsage, err = genaiconv.NewClientTokenUsage(genai, metric.WithExplicitBucketBoundaries(GenAITokenBuckets...))
	errs = append(errs, err)
	m.opDuration, err = genaiconv.NewClientOperationDuration(genai, metric.WithExplicitBucketBoundaries(GenAIDurationBuckets...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// The counters of rare events exist from the start, at zero, so that a
	// rate or an alert over them reads 0 rather than nothing.
	for _, c := range []metric.Int64Counter{m.gateRejected, m.rateLimited, m.retries, m.budgetDenied} {
		c.Add(context.Background(), 0, metric.WithAttributes(m.region))
	}
	return m, nil
}

func (m *metrics) work(w *store.Work, extra ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append([]attribute.KeyValue{m.region, attribute.String("lane", w.Lane),
		attribute.String("contract", w.Contract)}, extra...)...)
}

// claimed records how long w waited before this claim.
func (m *metrics) claimed(ctx context.Context, w *store.Work, at time.Time) {
	since := w.UpdatedAt
	if w.RetryAt.After(since) {
		since = w.RetryAt
	}
	m.queueWait.Record(ctx, max(at.Sub(since), 0).Seconds(), m.work(w))
}

// judged records one attempt: its active time, its call, and what the
// verdict says happens next.
func (m *metrics) judged(ctx context.Context, w *store.Work, c *contract.Contract, claimedAt time.Time, reply *model.Reply,
	callErr error, fail string, v verdict) {
	out := attribute.String("outcome", v.outcome)
	m.active.Record(ctx, time.Since(claimedAt).Seconds(), m.work(w, out))
	if reply != nil {
		m.call.Record(ctx, reply.Latency.Seconds(), metric.WithAttributes(m.region, attribute.String("contract", c.Name), out))
	}
	var mErr *model.Error
	if errors.As(callErr, &mErr) && mErr.Kind == model.KindRateLimited {
		m.rateLimited.Add(ctx, 1, metric.WithAttributes(m.region))
	}
	if fail != "" {
		m.gateRejected.Add(ctx, 1, metric.WithAttributes(m.region, attribute.String("contract", c.Name), attribute.String("code", fail)))
	}
	switch v.next {
	case "retry", "retry_raised_cap":
		m.retries.Add(ctx, 1, m.work(w, attribute.String("reason", v.outcome)))
	case "repair":
		m.retries.Add(ctx, 1, m.work(w, attribute.String("reason", "repair")))
	}
	// The work's end to end time, when this ended it, is the committer's
	// to record, as it announces the outcome: once for every ending.
}

// denied records an attempt the budget refused.
func (m *metrics) denied(ctx context.Context, w *store.Work) {
	m.budgetDenied.Add(ctx, 1, m.work(w, attribute.String("tenant", m.tel.Tenant(w.TenantID))))
}

// onFacts counts a claim made on an announcement's facts: taken, or lost
// and the row read.
func (m *metrics) onFacts(ctx context.Context, w *store.Work, claimed bool) {
	result := "reread"
	if claimed {
		result = "claimed"
	}
	m.onFactsClaims.Add(ctx, 1, m.work(w, attribute.String("result", result)))
}
