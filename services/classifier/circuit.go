package classifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// CircuitConfig shapes the cell's circuit breakers, one per model it
// calls: a model that fails call after call is a condition of the cell,
// not of each work item. While a model's circuit is open no work for that
// model is claimed: it waits in the stream, within its deadline, and one
// call at a time (a probe) asks whether the model answers again. Work for
// the cell's other models goes on.
type CircuitConfig struct {
	// Failures is how many consecutive transport failures (no answer, or a
	// 5xx) open the circuit. Default 5.
	Failures int
	// ProbeEvery is how long after opening the first probe goes out; each
	// probe that fails doubles the wait, up to ProbeMax. Defaults 1s (or
	// ProbeMax when smaller) and 30s.
	ProbeEvery, ProbeMax time.Duration
	// Now is the circuit's clock. Default time.Now.
	Now func() time.Time
}

func (c *CircuitConfig) defaults() {
	if c.Failures <= 0 {
		c.Failures = 5
	}
	if c.ProbeMax <= 0 {
		c.ProbeMax = 30 * time.Second
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = min(time.Second, c.ProbeMax)
	}
	c.ProbeEvery = min(c.ProbeEvery, c.ProbeMax)
	if c.Now == nil {
		c.Now = time.Now
	}
}

// circuitVars are the settings of the circuit FromEnv reads.
var circuitVars = []config.Var{
	{Name: "ASSAY_MODEL_CIRCUIT_FAILURES", Default: "5", Usage: "consecutive transport failures of a model that open the cell's circuit for it: its work waits instead of spending attempts"},
	{Name: "ASSAY_MODEL_PROBE_MAX", Default: "30s", Usage: "while a model's circuit is open, one probe call of it at most this far apart"},
}

func (c *CircuitConfig) fromEnv(getenv func(string) string) error {
	if err := config.Int(getenv, "ASSAY_MODEL_CIRCUIT_FAILURES", &c.Failures, 1, 1000); err != nil {
		return err
	}
	return config.Durations(getenv, config.Duration{Name: "ASSAY_MODEL_PROBE_MAX", To: &c.ProbeMax, Min: 100 * time.Millisecond, Max: time.Hour})
}

// circuitStore is where the cell keeps its circuits.
type circuitStore interface {
	OpenCircuit(ctx context.Context, model string, failures int, lastErr string, probeEvery time.Duration, now time.Time) (store.Circuit, bool, error)
	ProbeTurn(ctx context.Context, model string, maxEvery time.Duration, now time.Time) (store.Circuit, bool, error)
	CloseCircuit(ctx context.Context, model string, now time.Time) (bool, error)
}

// circuits are the cell's circuits as this instance sees them, one per
// model: the cell's own and each one a rollout's work names. Every model is
// asked at the one endpoint of the cell's model client (a rollout's variant
// names a model, never an endpoint), so the model alone names a circuit. A
// circuit is made on its model's first call here and keeps its own row in
// the cell's database.
type circuits struct {
	cfg    CircuitConfig
	cell   string
	region string
	st     circuitStore
	log    *slog.Logger
	probes metric.Int64Counter

	mu sync.Mutex
	by map[string]*circuit // model -> its circuit
}

func newCircuits(cfg CircuitConfig, names event.Names, region string, st circuitStore, log *slog.Logger,
	meter metric.Meter) (*circuits, error) {
	cfg.defaults()
	cs := &circuits{cfg: cfg, cell: names.Cell, region: region, st: st, log: log, by: map[string]*circuit{}}
	var err error
	if cs.probes, err = meter.Int64Counter("assay_provider_probes",
		metric.WithDescription("probe calls made while the cell's circuit for the model was open, by model and result")); err != nil {
		return nil, err
	}
	_, err = meter.Int64ObservableGauge("assay_provider_circuit_open",
		metric.WithDescription("1 while the cell's circuit for the model is open: the model does not answer and its work waits"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, c := range cs.all() {
				c.mu.Lock()
				open := c.open
				c.mu.Unlock()
				v := int64(0)
				if open {
					v = 1
				}
				o.Observe(v, c.attrs)
			}
			return nil
		}))
	return cs, err
}

// of is the circuit of the model mdl, made on first use.
func (cs *circuits) of(mdl string) *circuit {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.by[mdl]; ok {
		return c
	}
	c := &circuit{cfg: cs.cfg, cell: cs.cell, model: mdl, st: cs.st, log: cs.log, probes: cs.probes,
		attrs: metric.WithAttributes(attribute.String("region", cs.region), attribute.String("model", mdl))}
	for _, r := range []string{"answered", "failed"} {
		c.probes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("region", cs.region),
			attribute.String("model", mdl), attribute.String("result", r)))
	}
	cs.by[mdl] = c
	return c
}

// all are the circuits made so far.
func (cs *circuits) all() []*circuit {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := make([]*circuit, 0, len(cs.by))
	for _, c := range cs.by {
		out = append(out, c)
	}
	return out
}

// circuit is the cell's circuit for one model as this instance sees it.
// Whether it is open and when the next probe is due are the cell's, in its
// database, so the cell's classifiers make one probe per interval between
// them; the run of consecutive failures is this instance's.
type circuit struct {
	cfg    CircuitConfig
	cell   string
	model  string
	st     circuitStore
	log    *slog.Logger
	probes metric.Int64Counter
	attrs  metric.MeasurementOption

	mu       sync.Mutex
	open     bool
	since    time.Time
	failures int
	lastErr  string
	next     time.Time     // open: not before this does this instance ask for a probe
	every    time.Duration // open: the probe interval, which spreads the waiting work
	// recorded: the cell's database holds this opening; until it does,
	// this instance holds work and probes by itself.
	recorded bool
}

func (c *circuit) key() string { return "circuit:" + c.cell + ":" + c.model }

// hold says how long an announcement waits while the circuit is open and
// no probe is due here; held is false when the work may go on (the circuit
// is closed, or it is time to ask for a probe).
func (c *circuit) hold(now time.Time) (wait time.Duration, held bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.open || !now.Before(c.next) {
		return 0, false
	}
	return c.next.Sub(now) + rand.N(c.every/4+1), true
}

// turn asks the cell for the probe when the circuit is open: probe says
// this call is it; otherwise wait is how long the work waits. A circuit
// another classifier closed is closed here too.
func (c *circuit) turn(ctx context.Context, now time.Time) (probe bool, wait time.Duration, err error) {
	c.mu.Lock()
	open := c.open
	c.mu.Unlock()
	if !open {
		return false, 0, nil
	}
	cc, turn, err := c.st.ProbeTurn(ctx, c.model, c.cfg.ProbeMax, now)
	if err != nil {
		return false, 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.open:
		return false, 0, nil
	case cc.State != store.CircuitOpen && cc.Since.After(c.since):
		c.closed("another classifier's probe was answered")
		return false, 0, nil
	case cc.State != store.CircuitOpen && !c.recorded:
		// The cell has no record of this opening yet (or could not take
		// it): this instance probes on its own schedule.
		if now.Before(c.next) {
			return false, c.next.Sub(now) + rand.N(c.every/4+1), nil
		}
		c.next, c.every = now.Add(c.every), min(2*c.every, c.cfg.ProbeMax)
		return true, 0, nil
	case cc.State != store.CircuitOpen:
		c.closed("the cell's circuit is closed")
		return false, 0, nil
	}
	c.next, c.every = cc.NextProbeAt, max(cc.ProbeEvery/2, time.Millisecond)
	if turn {
		return true, 0, nil
	}
	return false, max(c.next.Sub(now), 0) + rand.N(c.every/4+1), nil
}

// observe takes in how a call went. outage says the call failed because
// the provider is unreachable: the circuit was open, or this call opened
// it; such an attempt is not counted against the work's budget.
func (c *circuit) observe(ctx context.Context, reply *model.Reply, err error, deadlineBound, probe bool) (outage bool) {
	r := reach(reply, err, deadlineBound)
	if probe && r != unheard {
		result := "answered"
		if r == unreached {
			result = "failed"
		}
		c.probes.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)), c.attrs)
	}
	switch r {
	case reached:
		c.mu.Lock()
		wasOpen := c.open
		c.failures = 0
		c.mu.Unlock()
		if wasOpen {
			if _, err := c.st.CloseCircuit(context.WithoutCancel(ctx), c.model, c.cfg.Now()); err != nil {
				c.log.Warn("closing the circuit in the database failed; its next probe closes it", "key", c.key(), "err", err)
			}
			c.mu.Lock()
			if c.open {
				c.closed("the model answered")
			}
			c.mu.Unlock()
		}
		return false
	case unheard:
		return false
	}
	now := c.cfg.Now()
	c.mu.Lock()
	c.failures++
	c.lastErr = errText(err)
	trip := !c.open && c.failures >= c.cfg.Failures
	if trip {
		// Held here at once; the cell's record follows.
		c.open, c.since, c.next, c.every = true, now, now.Add(c.cfg.ProbeEvery), c.cfg.ProbeEvery
	}
	open, failures, last := c.open, c.failures, c.lastErr
	c.mu.Unlock()
	if !trip {
		return open
	}
	cc, opened, err := c.st.OpenCircuit(context.WithoutCancel(ctx), c.model, failures, last, c.cfg.ProbeEvery, now)
	if err != nil {
		// The cell's database did not answer: this instance holds the
		// work by itself until its first probe.
		c.log.Warn("opening the circuit in the database failed", "key", c.key(), "err", err)
	}
	c.mu.Lock()
	if err == nil && cc.State == store.CircuitOpen && c.open {
		// Another classifier may have opened it first: its probe times hold.
		c.since, c.next, c.every, c.recorded = cc.Since, cc.NextProbeAt, cc.ProbeEvery, true
	}
	next := c.next
	c.mu.Unlock()
	c.log.Warn("model unreachable: the cell's circuit is open; work waits in the stream and one probe call at a time asks again",
		"key", c.key(), "model", c.model, "failures", failures, "last_error", last, "opened_here", opened,
		"next_probe", next.UTC().Format(time.RFC3339Nano))
	telemetry.Decision(ctx, c.log, c.key(), "circuit_open", fmt.Sprintf("%d consecutive transport failures; last: %s", failures, last))
	return true
}

// closed closes the circuit here; called with mu held.
func (c *circuit) closed(why string) {
	down := c.cfg.Now().Sub(c.since).Round(time.Millisecond)
	c.open, c.failures, c.recorded = false, 0, false
	c.log.Warn("model answers again: the cell's circuit is closed", "key", c.key(), "model", c.model, "down_for", down.String(), "why", why)
	telemetry.Decision(context.Background(), c.log, c.key(), "circuit_closed", fmt.Sprintf("%s after %s", why, down))
}

// condition describes the open circuit for a work item's reason: why it
// ended without an answer.
func (c *circuit) condition() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%s: the model %s has not answered since %s (%s)", outcome.ReasonProviderUnavailable, c.model,
		c.since.UTC().Format(time.RFC3339), c.lastErr)
}

// How a call went, as the circuit sees it.
const (
	reached   = iota // the provider answered, whatever it said
	unreached        // no answer, or a 5xx: the provider is not serving
	unheard          // says nothing of the provider (canceled, cut by the work's deadline)
)

func reach(reply *model.Reply, err error, deadlineBound bool) int {
	var mErr *model.Error
	switch {
	case err == nil:
		return reached
	case errors.Is(err, context.Canceled):
		return unheard
	case !errors.As(err, &mErr):
		return unreached
	case mErr.Kind == model.KindCanceled || (mErr.Kind == model.KindTimeout && deadlineBound):
		return unheard
	case mErr.Kind == model.KindTimeout:
		return unreached
	case mErr.Kind == model.KindTransient && mErr.Status == http.StatusServiceUnavailable && mErr.RetryAfter > 0:
		// Overloaded, and saying when to come back: it answers.
		return reached
	case mErr.Kind == model.KindTransient:
		return unreached
	}
	return reached
}

// circuitOf is the circuit of the model w is asked of.
func (s *Service) circuitOf(w *store.Work) *circuit { return s.circs.of(s.modelOf(w)) }

// waitForProvider holds an announcement while the circuit of its work's
// model is open: the message comes back when the next probe may be due,
// and work whose deadline cannot wait that long ends now, saying the model
// was unavailable. Work for another model goes on. held is false when the
// work goes on.
func (s *Service) waitForProvider(ctx context.Context, ev event.Work, w *store.Work, need time.Duration) (consumer.Disposition, bool) {
	if s.batches != nil && ev.Lane == event.Batch {
		// A line of a provider batch: no call of a circuit's.
		return consumer.Disposition{}, false
	}
	circ := s.circuitOf(w)
	now := circ.cfg.Now()
	wait, held := circ.hold(now)
	if !held {
		return consumer.Disposition{}, false
	}
	if ev.DeadlineAt.IsZero() || now.Add(wait+need).Before(ev.DeadlineAt) {
		telemetry.Decision(ctx, s.d.Log, ev.WorkID, "held", "the cell's circuit for the model is open; waiting for its next probe",
			slog.String("model", circ.model), slog.Duration("delay", wait))
		return consumer.Retry(wait), true
	}
	w, _, err := s.d.Store.WorkToRun(ctx, ev.WorkID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return consumer.Refuse(), true
	case err != nil:
		return consumer.Retry(wait), true
	case w.Terminal():
		return consumer.Done(), true
	}
	return s.finishUnleased(ctx, w, outcome.RetryExhausted, circ.condition()+"; its deadline comes before the next probe"), true
}

// probeTurn is the last look before a claim while the circuit of w's model
// is open: the cell's probe of the model goes on as this call, other work
// for the model waits for it.
func (s *Service) probeTurn(ctx context.Context, w *store.Work) (probe bool, disp consumer.Disposition, ok bool) {
	circ := s.circuitOf(w)
	probe, wait, err := circ.turn(ctx, circ.cfg.Now())
	if err != nil {
		s.d.Log.Warn("asking for the circuit's probe failed", "key", w.ID, "model", circ.model, "err", err)
		return false, consumer.Retry(time.Second), false
	}
	if wait > 0 {
		telemetry.Decision(ctx, s.d.Log, w.ID, "held", "another call is the cell's probe of the model; waiting for it",
			slog.String("model", circ.model), slog.Duration("delay", wait))
		return false, consumer.Retry(wait), false
	}
	if probe {
		telemetry.Decision(ctx, s.d.Log, w.ID, "probe", "the cell's circuit for the model is open; this call asks whether it answers again",
			slog.String("model", circ.model))
	}
	return probe, consumer.Disposition{}, true
}
