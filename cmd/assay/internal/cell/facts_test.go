package cell_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// readCounter is the cell's store, counting the work rows the classifier
// reads before a claim.
type readCounter struct {
	*store.Store
	reads atomic.Int64
}

func (r *readCounter) WorkToRunGroup(ctx context.Context, ids []string) []store.ToRun {
	r.reads.Add(int64(len(ids)))
	return r.Store.WorkToRunGroup(ctx, ids)
}

func (r *readCounter) WorkToRun(ctx context.Context, id string) (*store.Work, bool, error) {
	r.reads.Add(1)
	return r.Store.WorkToRun(ctx, id)
}

// A worker claims on an announcement's facts without reading the row once
// it knows the tenant's budget; facts that no longer hold (another attempt
// since, a deadline said to be past) send it to the row, which decides: the
// work is run, never ended on what the facts said.
func TestClaimOnFacts(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true})
	b.HandClassifiers(t) // the RESULT and ATTEMPT streams and their relay
	env := b.Cell.Env
	st := &readCounter{Store: env.Store}
	w, err := classifier.New(classifier.Config{Region: "us", Names: env.Config.Names(), Model: "assay-sim-1"},
		classifier.Deps{Store: st, JS: env.JS, Model: cell.ModelClient(env.Config), Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Relay().Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Relay().Stop(context.Background()) })
	ctx := context.Background()
	// announce is the announcement ingress writes for the work, its facts
	// changed by change.
	announce := func(id string, change func(f *event.WorkFacts)) (event.Work, celltest.Delivery) {
		t.Helper()
		row, _, err := env.Store.WorkToRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ingress.WorkMessage(ctx, b.Names(), row, row.Dispatch)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := event.Parse[event.Work](m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		f, ok := event.ParseFacts(m.Headers[event.FactsHeader])
		if !ok {
			t.Fatalf("the announcement carries no facts: %v", m.Headers)
		}
		change(&f)
		raw, _ := json.Marshal(f)
		return ev, celltest.Delivery{Header: nats.Header{event.FactsHeader: []string{string(raw)}}}
	}
	run := func(name string, change func(f *event.WorkFacts), wantReads int64) {
		t.Helper()
		req := celltest.CodeReview(evalset.Items()[0], "facts "+name)
		req.Revision = strings.ReplaceAll(name, " ", "-")
		_, r := b.Submit(t, req)
		before := st.reads.Load()
		ev, d := announce(r.WorkID, change)
		if disp := w.Process(ctx, ev, d); disp.Settle != consumer.Ack {
			t.Fatalf("%s: disposition %+v, want ack", name, disp)
		}
		if got := b.Wait(t, r.WorkID); *got.Outcome != "accepted" {
			t.Fatalf("%s: outcome %s (%s), want accepted", name, *got.Outcome, got.Reason)
		}
		if reads := st.reads.Load() - before; reads != wantReads {
			t.Fatalf("%s: %d reads of the work row, want %d (lane %s, facts %s)", name, reads, wantReads, ev.Lane, d.Header.Get(event.FactsHeader))
		}
	}
	same := func(*event.WorkFacts) {}
	run("first", same, 1) // the tenant's budget is not known yet
	run("known", same, 0)
	run("stale attempts", func(f *event.WorkFacts) { f.Attempts = 1 }, 1)
	run("past deadline", func(f *event.WorkFacts) { f.DeadlineAt = time.Now().Add(-time.Minute) }, 1)
	run("input size", func(f *event.WorkFacts) { f.InputBytes-- }, 1)
	b.WaitLedger(t, "acme", 5)
	if n := b.Calls("acme"); n != 5 {
		t.Fatalf("model calls = %d, want 5", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts`); n != 5 {
		t.Fatalf("%d attempts, want 5: a claim lost on facts leaves none", n)
	}
}
