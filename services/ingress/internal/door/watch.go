package door

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// ViewWindow is how far back the work views count: work created in the
// last day, what a dashboard's overview shows.
const ViewWindow = 24 * time.Hour

// watch is what ingress samples of the cell's database for its gauges,
// every WatchEvery: the oldest unfinished work per lane, the work of the
// last day by what a reviewer sees, and the outbox rows not yet published
// per stream. A scrape reads the last sample; it never queries the
// database.
type watch struct {
	mu     sync.Mutex
	oldest map[string]time.Duration
	views  map[string]int64
	outbox map[string]store.OutboxBacklog
}

// Sample reads the gauges of the cell's work again: a pass of the watch
// ticker.
func (s *Door) Sample(ctx context.Context) (bool, error) {
	oldest, err := s.D.Store.Oldest(ctx)
	if err != nil {
		return false, err
	}
	views, err := s.D.Store.Views(ctx, ViewWindow)
	if err != nil {
		return false, err
	}
	outbox, err := s.D.Store.Outbox(ctx)
	if err != nil {
		return false, err
	}
	s.watched.mu.Lock()
	s.watched.oldest, s.watched.views, s.watched.outbox = oldest, views, outbox
	s.watched.mu.Unlock()
	return false, nil
}

// Views is the last sample of the work views (see store.Views).
func (s *Door) Views() map[string]int64 {
	s.watched.mu.Lock()
	defer s.watched.mu.Unlock()
	out := make(map[string]int64, len(s.watched.views))
	for k, v := range s.watched.views {
		out[k] = v
	}
	return out
}

// sampled is one gauge over the last sample: for each key of its label,
// the value read under the sample's lock.
type sampled struct {
	name, unit, desc, label string
	keys                    []string
	value                   func(w *watch, key string) float64
}

var reviewViews = []string{store.ViewRunning, store.ViewAccepted, store.ViewNeedsReview, store.ViewRejected, store.ViewTerminal}

var sampledGauges = []sampled{
	{"assay_oldest_unfinished", "s", "age of the oldest work without an outcome, per lane", "lane", event.Lanes,
		func(w *watch, k string) float64 { return w.oldest[k].Seconds() }},
	{"assay_work_views", "", "work by what a reviewer sees: needs_review is every open review item; running, accepted, rejected and terminal count the last day's work with none", "view", reviewViews,
		func(w *watch, k string) float64 { return float64(w.views[k]) }},
	{"assay_outbox_pending", "", "outbox rows of the cell waiting for their relay, per stream", "stream", event.Kinds,
		func(w *watch, k string) float64 { return float64(w.outbox[k].Pending) }},
	{"assay_outbox_oldest_pending", "s", "age of the cell's oldest outbox row waiting for its relay, per stream", "stream", event.Kinds,
		func(w *watch, k string) float64 { return w.outbox[k].Oldest.Seconds() }},
	{"assay_outbox_set_aside_rows", "", "outbox rows of the cell set aside and not yet retried, per stream", "stream", event.Kinds,
		func(w *watch, k string) float64 { return float64(w.outbox[k].SetAside) }},
}

// watchMetrics registers the gauges of the samples, and the counter of
// what ingress itself drops (the end to end time of what it ends is the
// committer's to record, when it announces the outcome).
func (s *Door) watchMetrics() error {
	m := s.D.Tel.Meter()
	region := attribute.String("region", s.Cfg.Region)
	for _, g := range sampledGauges {
		opts := []metric.Float64ObservableGaugeOption{metric.WithDescription(g.desc),
			metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
				s.watched.mu.Lock()
				defer s.watched.mu.Unlock()
				for _, k := range g.keys {
					o.Observe(g.value(&s.watched, k), metric.WithAttributes(region, attribute.String(g.label, k)))
				}
				return nil
			})}
		if g.unit != "" {
			opts = append(opts, metric.WithUnit(g.unit))
		}
		if _, err := m.Float64ObservableGauge(g.name, opts...); err != nil {
			return err
		}
	}
	var err error
	if s.Dropped, err = m.Int64Counter("assay_dropped", metric.WithDescription("work stored dropped by admission, by lane and why")); err != nil {
		return err
	}
	for _, lane := range event.Lanes { // at zero from the start: a rate over it reads 0, not nothing
		s.Dropped.Add(context.Background(), 0, metric.WithAttributes(region, attribute.String("lane", lane), attribute.String("reason", "over_rate")))
	}
	return nil
}
