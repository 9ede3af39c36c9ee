package classifier

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
)

// stressCell is one cell for every classifier a Stress call makes: the
// database, JetStream and simulated provider classifier_test.go's setup
// makes, with the WORK stream ingress would have made, and none of the
// classifiers started.
type stressCell struct {
	st  *store.Store
	db  *pgxpool.Pool
	js  jetstream.JetStream
	sim string
	reg *contract.Registry
}

func newStressCell(t *testing.T) *stressCell {
	t.Helper()
	ctx := t.Context()
	st, url := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	js := testenv.JetStream(t)
	if _, err := event.EnsureStream(ctx, js, nil, event.Names{Cell: "us"}, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	s := sim.New(sim.Options{Latency: 20 * time.Millisecond})
	simURL, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	return &stressCell{st: st, db: testenv.Pool(t, url), js: js, sim: sim.APIBase(simURL), reg: reg}
}

// announce stores n work items in each lane and announces them, as
// ingress would, so the first classifiers stopped hold work.
func (c *stressCell) announce(t *testing.T, n int) {
	t.Helper()
	ctx := t.Context()
	names := event.Names{Cell: "us"}
	for _, lane := range event.Lanes {
		for i := range n {
			src := fmt.Sprintf("stress-%s-%d", lane, i)
			in, _ := json.Marshal(map[string]string{"text": "message " + src})
			w, _, err := c.st.InsertWork(ctx, &store.Work{ID: "w_" + src, TenantID: "acme", Region: "us", Contract: "moderation",
				SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: src, Revision: "r1", Lane: lane,
				Input: string(in), Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)},
				func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
			if err != nil {
				t.Fatal(err)
			}
			ev, _ := json.Marshal(event.Work{WorkID: w.ID, TenantID: "acme", Region: "us", Lane: lane, Dispatch: 1, DeadlineAt: w.DeadlineAt})
			if _, err := c.js.Publish(ctx, names.Work(lane, "acme"), ev); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// classifier builds a classifier of the cell, not started, with its own
// telemetry as each process has.
func (c *stressCell) classifier(t *testing.T, edit func(*Config)) *Service {
	t.Helper()
	tel := telemetrytest.Provider(t, "classifier", "us")
	cfg := Config{Region: "us", Model: "assay-sim-1", BackoffBase: 10 * time.Millisecond, ReportEvery: 5 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg, Deps{Store: c.st, JS: c.js, Model: &model.Client{BaseURL: c.sim, Model: "assay-sim-1"}, Contracts: c.reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// providerBatch turns the provider batch lane on, polled often.
func providerBatch(cfg *Config) {
	cfg.ProviderBatch = ProviderBatch{On: true, PollEvery: 5 * time.Millisecond, Flush: 5 * time.Millisecond}
}

// TestServiceLifecycle holds a whole classifier (its RESULT and ATTEMPT
// streams, cancel subscription, relay, capacity reporter and both lanes'
// consumers, with the cell's model-call slots) to the contract of every
// part, with announced work to take while it starts and stops.
func TestServiceLifecycle(t *testing.T) {
	c := newStressCell(t)
	c.announce(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return c.classifier(t, nil) })
}

// TestWarmServiceLifecycle is the same with each Stop meeting a ready
// classifier, whose lanes consume: the first ones stopped hold work.
func TestWarmServiceLifecycle(t *testing.T) {
	c := newStressCell(t)
	c.announce(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		s := c.classifier(t, nil)
		return lifecycletest.Warm(s, s.Ready)
	})
	c.ended(t)
}

// ended logs how far the announced work went.
func (c *stressCell) ended(t *testing.T) {
	t.Helper()
	rows, err := c.db.Query(t.Context(), `SELECT state, count(*) FROM work GROUP BY state ORDER BY state`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			t.Fatal(err)
		}
		t.Logf("work %s: %d", state, n)
	}
}

// TestServiceWithProviderBatchLifecycle is the same with the provider
// batch lane on, whose ticker is one more part; each instance keeps its
// own limit.
func TestServiceWithProviderBatchLifecycle(t *testing.T) {
	c := newStressCell(t)
	c.announce(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return c.classifier(t, func(cfg *Config) { providerBatch(cfg); cfg.InstanceScope = true })
	})
}

// TestLaneLifecycle holds each lane's consumer, behind the classifier's
// limiter and its fair share, to the contract of every part, each Stop
// meeting it consuming.
func TestLaneLifecycle(t *testing.T) {
	c := newStressCell(t)
	for i, lane := range lanes {
		t.Run(lane, func(t *testing.T) {
			lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
				s := c.classifier(t, nil)
				t.Cleanup(func() {
					if s.slots != nil {
						s.slots.Stop()
					}
				})
				return lifecycletest.Warm(s.lanes[i], s.lanes[i].Ready)
			})
		})
	}
}

// TestCapacityReporterLifecycle holds the capacity reporter, which puts
// the instance's report into the cell's capacity bucket, to the contract
// of every part.
func TestCapacityReporterLifecycle(t *testing.T) {
	c := newStressCell(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return &c.classifier(t, nil).report })
}

// TestProviderBatchTickerLifecycle holds the provider batch lane's ticker
// to the contract of every part.
func TestProviderBatchTickerLifecycle(t *testing.T) {
	c := newStressCell(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &c.classifier(t, func(cfg *Config) { providerBatch(cfg); cfg.InstanceScope = true }).batches.ticker
	})
}

// slowConn is the cell's JetStream whose Conn, which Start reads the
// server's largest payload through once its streams are made, passes the
// pause.
type slowConn struct {
	JetStream
	pause *lifecycletest.Pause
}

func (s *slowConn) Conn() *nats.Conn {
	s.pause.Enter()
	return s.JetStream.Conn()
}

// TestStopDuringStartLifecycle is StartRacesStop of Stress with the Stop
// held to the moment Start has made its streams and not yet subscribed to
// the cancels: the race a Stress run meets only by chance. Under the race
// detector it finds what Start and Stop share touched without a lock;
// after the Stop that follows both, nothing of the classifier runs.
func TestStopDuringStartLifecycle(t *testing.T) {
	c := newStressCell(t)
	for range 3 {
		s := c.classifier(t, nil)
		js := &slowConn{JetStream: s.d.JS, pause: lifecycletest.NewPause(50 * time.Millisecond)}
		s.d.JS = js
		lifecycletest.StopWhileStarting(t, s, js.pause)
	}
}
