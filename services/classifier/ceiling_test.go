package classifier_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/classifier"
)

// peakFront counts the calls the provider has at once. A call is held
// until fill calls were in flight at once (up to 5s), so that whether
// they overlap does not depend on how quickly a loaded machine brings
// the next ones.
type peakFront struct {
	next        http.Handler
	fill        int64
	now, peak   atomic.Int64
	calls, seen atomic.Int64
}

func (f *peakFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/chat/completions" {
		n := f.now.Add(1)
		defer f.now.Add(-1)
		for old := f.peak.Load(); n > old && !f.peak.CompareAndSwap(old, n); old = f.peak.Load() {
		}
		f.calls.Add(1)
		for end := time.Now().Add(5 * time.Second); f.peak.Load() < f.fill && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	f.next.ServeHTTP(w, r)
}

// Three classifier instances of one cell, each on its own NATS connection
// and each pinned at the cell's ceiling of 3 calls (fixed concurrency),
// work through 24 items against a provider that takes 150ms a call: the
// provider never has more than 3 calls at once, the cell's ceiling, and it
// has 3 at times (without the shared slots it would see up to 9).
func TestThreeClassifiersShareTheCellCeiling(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st, _ := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	const ceiling, items = 3, 24
	front := &peakFront{next: sim.New(sim.Options{Latency: 150 * time.Millisecond}), fill: ceiling}
	provider := httptest.NewServer(front)
	t.Cleanup(provider.Close)
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	natsURL := testenv.NATS(t)
	connect := func(name string) jetstream.JetStream {
		nc, err := nats.Connect(natsURL, nats.Name(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	js := connect("test")
	if _, err := event.EnsureStream(ctx, js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tel := telemetrytest.Provider(t, "classifier", "us")
		svc, err := classifier.New(classifier.Config{Region: "us", Model: "assay-sim-1", Concurrency: ceiling, FixedConcurrency: true},
			classifier.Deps{Store: st, JS: connect(fmt.Sprintf("classifier-%d", i)), Model: &model.Client{BaseURL: sim.APIBase(provider.URL), Model: "assay-sim-1"},
				Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Stop(context.Background()) })
	}
	for i := range items {
		id := fmt.Sprintf("w_ceiling_%02d", i)
		in, _ := json.Marshal(map[string]string{"text": fmt.Sprintf("message %d", i)})
		w, _, err := st.InsertWork(ctx, &store.Work{ID: id, TenantID: "acme", Region: "us", Contract: "moderation",
			SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: id, Revision: "r1", Lane: event.Interactive,
			Input: string(in), Digest: "sha256:00", DeadlineAt: time.Now().Add(2 * time.Minute)},
			func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
		if err != nil {
			t.Fatal(err)
		}
		ev, _ := json.Marshal(event.Work{WorkID: w.ID, TenantID: "acme", Region: "us", Lane: event.Interactive, Dispatch: 1, DeadlineAt: w.DeadlineAt})
		if _, err := js.Publish(ctx, names.Work(event.Interactive, "acme"), ev); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for front.calls.Load() < items {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls made in 90s", front.calls.Load(), items)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p := front.peak.Load(); p != ceiling {
		t.Errorf("the provider had at most %d calls at once from three classifiers, want the cell's ceiling %d", p, ceiling)
	}
	t.Logf("%d calls, at most %d at once", front.calls.Load(), front.peak.Load())
}
