package classifier

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
)

// manual is a clock that moves only when the test says.
type manual struct {
	mu sync.Mutex
	t  time.Time
}

func (m *manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.t
}

func (m *manual) Set(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.t = t
}

var refused = &model.Error{Kind: model.KindTransient, Err: errors.New("dial tcp 127.0.0.1:9: connect: connection refused")}

// The cell's circuit, seen by two classifiers on one database: consecutive
// transport failures open it; while open, work is held until the next
// probe; the cell gets one probe per interval between both classifiers,
// the interval doubling up to its cap while probes fail; an answer closes
// it, and the other classifier learns so at its next look.
func TestCircuitOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, _ := storetest.Migrated(t)
	clk := &manual{t: t0}
	cfg := CircuitConfig{Failures: 3, ProbeEvery: time.Second, ProbeMax: 4 * time.Second, Now: clk.Now}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	mk := func() *circuit {
		cs, err := newCircuits(cfg, event.Names{Cell: "us"}, "us", st, log, noop.NewMeterProvider().Meter("test"))
		if err != nil {
			t.Fatal(err)
		}
		return cs.of("m")
	}
	a, b := mk(), mk()
	for i := range 2 {
		if a.observe(ctx, nil, refused, false, false) {
			t.Fatalf("failure %d counted as an outage before the circuit opened", i+1)
		}
	}
	// A 429 or any answer says the provider is there: the run starts over.
	a.observe(ctx, &model.Reply{}, &model.Error{Kind: model.KindRateLimited, Status: 429}, false, false)
	for range 2 {
		a.observe(ctx, nil, refused, false, false)
	}
	if _, held := a.hold(clk.Now()); held {
		t.Fatal("open after two failures in a row")
	}
	if !a.observe(ctx, nil, refused, false, false) {
		t.Fatal("the third failure in a row did not open the circuit")
	}
	c, _ := st.GetCircuit(ctx, "m")
	if c.State != store.CircuitOpen || c.Failures != 3 || !c.NextProbeAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("circuit in the database: %+v", c)
	}
	if wait, held := a.hold(clk.Now()); !held || wait < time.Second || wait > time.Second+time.Second/4 {
		t.Fatalf("work while open: held %v for %s; want it held until the probe", held, wait)
	}
	// b has seen nothing yet: its calls go out until its own run opens it
	// locally, on the cell's circuit and its probe time.
	for range 3 {
		b.observe(ctx, nil, refused, false, false)
	}
	if _, held := b.hold(clk.Now()); !held {
		t.Fatal("b not open after its own three failures")
	}
	var probes []time.Duration
	last := t0
	for range 4 {
		c, _ = st.GetCircuit(ctx, "m")
		clk.Set(c.NextProbeAt)
		probes = append(probes, c.NextProbeAt.Sub(last))
		last = c.NextProbeAt
		pa, wa, err := a.turn(ctx, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		pb, wb, err := b.turn(ctx, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if pa == pb || (pa && wb == 0) || (pb && wa == 0) {
			t.Fatalf("at %s: a probe %v (wait %s), b probe %v (wait %s); want one probe for the cell", clk.Now().Sub(t0), pa, wa, pb, wb)
		}
		if !a.observe(ctx, nil, refused, false, true) {
			t.Fatal("a failed probe not counted as an outage")
		}
	}
	want := []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second}
	for i := range want {
		if probes[i] != want[i] {
			t.Fatalf("probe intervals %v, want %v (doubling to the cap)", probes, want)
		}
	}
	c, _ = st.GetCircuit(ctx, "m")
	clk.Set(c.NextProbeAt)
	if probe, _, _ := b.turn(ctx, clk.Now()); !probe {
		t.Fatal("b did not get the probe that was due")
	}
	if b.observe(ctx, &model.Reply{Content: "{}"}, nil, false, true) {
		t.Fatal("an answered probe counted as an outage")
	}
	if c, _ = st.GetCircuit(ctx, "m"); c.State != store.CircuitClosed {
		t.Fatalf("after an answered probe the circuit is %s", c.State)
	}
	if _, held := b.hold(clk.Now()); held {
		t.Fatal("b still holds work after its probe was answered")
	}
	// a holds work until its next look, which finds the circuit closed.
	if _, held := a.hold(clk.Now().Add(-time.Millisecond)); !held {
		t.Fatal("a let work go before its next look")
	}
	if probe, wait, err := a.turn(ctx, clk.Now()); probe || wait != 0 || err != nil {
		t.Fatalf("a's look at the closed circuit: probe %v, wait %s, %v", probe, wait, err)
	}
	if _, held := a.hold(clk.Now()); held {
		t.Fatal("a still holds work after the cell's circuit closed")
	}
	t.Logf("opened after 3 failures in a row; probe intervals %v; closed by b's answered probe, a learned it at its next look", probes)
}

// Each model the cell calls has its own circuit: failures of a rollout's
// model open its circuit and its row alone, answers of the cell's model in
// between do not close it, and the cell's model's work is never held.
func TestCircuitPerModel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, _ := storetest.Migrated(t)
	clk := &manual{t: t0}
	cfg := CircuitConfig{Failures: 3, ProbeEvery: time.Second, ProbeMax: 4 * time.Second, Now: clk.Now}
	cs, err := newCircuits(cfg, event.Names{Cell: "us"}, "us", st, slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		noop.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	live, cand := cs.of("m"), cs.of("candidate")
	if cs.of("candidate") != cand || len(cs.all()) != 2 {
		t.Fatalf("circuits %v: want one per model, made once", cs.all())
	}
	for i := range 3 {
		cand.observe(ctx, nil, refused, false, false)
		if live.observe(ctx, &model.Reply{}, nil, false, false) {
			t.Fatalf("an answer of the cell's model after the candidate's failure %d counted as an outage", i+1)
		}
	}
	if _, held := cand.hold(t0); !held {
		t.Fatal("three failures of the candidate in a row did not open its circuit")
	}
	if _, held := live.hold(t0); held {
		t.Fatal("the candidate's failures hold the cell's model's work")
	}
	if probe, wait, err := live.turn(ctx, t0); probe || wait != 0 || err != nil {
		t.Fatalf("the cell's model at its claim: probe %v, wait %s, %v; want it to go on", probe, wait, err)
	}
	if c, _ := st.GetCircuit(ctx, "candidate"); c.State != store.CircuitOpen || c.Failures != 3 {
		t.Fatalf("the candidate's circuit in the database: %+v", c)
	}
	if c, _ := st.GetCircuit(ctx, "m"); c.State != store.CircuitClosed {
		t.Fatalf("the cell's model's circuit in the database: %+v", c)
	}
	clk.Set(t0.Add(time.Second))
	if probe, _, err := cand.turn(ctx, clk.Now()); !probe || err != nil {
		t.Fatalf("the candidate's first probe: %v, %v", probe, err)
	}
	cand.observe(ctx, &model.Reply{}, nil, false, true)
	if c, _ := st.GetCircuit(ctx, "candidate"); c.State != store.CircuitClosed {
		t.Fatalf("after its answered probe the candidate's circuit is %s", c.State)
	}
}

// What a call says of the provider: any answer reaches it; no answer, a
// 5xx or a call timeout does not; a cancel or a cut by the work's own
// deadline says nothing.
func TestReach(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		err           error
		deadlineBound bool
		want          int
	}{
		{"answer", nil, false, reached},
		{"429", &model.Error{Kind: model.KindRateLimited, Status: 429}, false, reached},
		{"503 with Retry-After", &model.Error{Kind: model.KindTransient, Status: 503, RetryAfter: time.Second}, false, reached},
		{"400", &model.Error{Kind: model.KindRejected, Status: 400}, false, reached},
		{"refusal", &model.Error{Kind: model.KindRefused, Status: 200}, false, reached},
		{"connection refused", refused, false, unreached},
		{"500", &model.Error{Kind: model.KindTransient, Status: 500}, false, unreached},
		{"call timeout", &model.Error{Kind: model.KindTimeout}, false, unreached},
		{"cut by the work's deadline", &model.Error{Kind: model.KindTimeout}, true, unheard},
		{"canceled", &model.Error{Kind: model.KindCanceled}, false, unheard},
		{"worker stopping", context.Canceled, false, unheard},
	} {
		if got := reach(nil, c.err, c.deadlineBound); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// unrecorded is the cell's database when it cannot take an opening.
type unrecorded struct{ circuitStore }

func (unrecorded) OpenCircuit(context.Context, string, int, string, time.Duration, time.Time) (store.Circuit, bool, error) {
	return store.Circuit{}, false, errors.New("the database did not answer")
}

// A circuit this classifier opened that the cell has no record of (its
// database did not take it, or not yet) stays open here: work is held, and
// this classifier probes on its own schedule, until an answer closes it.
func TestCircuitOpenedHereBeforeTheCellKnows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, _ := storetest.Migrated(t)
	clk := &manual{t: t0}
	cfg := CircuitConfig{Failures: 2, ProbeEvery: time.Second, ProbeMax: 4 * time.Second, Now: clk.Now}
	cs, err := newCircuits(cfg, event.Names{Cell: "us"}, "us", unrecorded{st}, slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		noop.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	c := cs.of("m")
	c.observe(ctx, nil, refused, false, false)
	if !c.observe(ctx, nil, refused, false, false) {
		t.Fatal("two failures in a row did not open the circuit")
	}
	if probe, wait, err := c.turn(ctx, clk.Now()); probe || wait <= 0 || err != nil {
		t.Fatalf("before its probe: probe %v, wait %s, %v; want the work held, the circuit open", probe, wait, err)
	}
	clk.Set(t0.Add(time.Second))
	if probe, _, _ := c.turn(ctx, clk.Now()); !probe {
		t.Fatal("no probe of its own when it was due")
	}
	if !c.observe(ctx, nil, refused, false, true) {
		t.Fatal("a failed probe not counted as an outage")
	}
	if probe, wait, _ := c.turn(ctx, clk.Now()); probe || wait < time.Second {
		t.Fatalf("right after a probe: probe %v, wait %s; want the next one an interval off", probe, wait)
	}
	clk.Set(t0.Add(2 * time.Second))
	if probe, _, _ := c.turn(ctx, clk.Now()); !probe {
		t.Fatal("no second probe when it was due")
	}
	c.observe(ctx, &model.Reply{Content: "{}"}, nil, false, true)
	if _, held := c.hold(clk.Now()); held {
		t.Fatal("still held after the probe was answered")
	}
}
