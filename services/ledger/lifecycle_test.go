package ledger

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
)

// stressLedger is newTestLedger's database, with JetStream, the ATTEMPT
// stream the classifier would have made and attempts waiting in it; the
// part it returns builds one more ledger of it, not started, its reaper
// passing often.
func stressLedger(t *testing.T, attempts int) (db *pgxpool.Pool, newPart func(t *testing.T) *Service) {
	t.Helper()
	_, st, db := newTestLedger(t, Config{Region: "us"}, "acme")
	js := testenv.JetStream(t)
	names := event.Names{Cell: "us"}
	if _, err := event.EnsureStream(t.Context(), js, nil, names, event.KindAttempt, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	for i := range attempts {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		if _, _, err := st.InsertWork(t.Context(), &store.Work{ID: fmt.Sprintf("w_stress%d", i), TenantID: "acme", Region: "us",
			Contract: "moderation", SchemaVersion: "1", TaxonomyVersion: "1", SourceID: fmt.Sprintf("t/stress%d", i), Revision: "r1",
			Lane: "batch", Input: `{"text":"x"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)},
			func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.Claim(t.Context(), fmt.Sprintf("w_stress%d", i), id, fmt.Sprintf("00000000-0000-4000-9000-%012d", i), time.Minute, 0); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		ev, _ := json.Marshal(event.Attempt{AttemptID: id, WorkID: fmt.Sprintf("w_stress%d", i), TenantID: "acme", Region: "us",
			Model: "assay-sim-1", Outcome: "ok", InputUnits: 100, OutputUnits: 10, At: time.Now()})
		if _, err := js.Publish(t.Context(), names.Attempt("acme"), ev); err != nil {
			t.Fatal(err)
		}
	}
	return db, func(t *testing.T) *Service {
		tel := telemetrytest.Provider(t, "ledger", "us")
		s, err := New(Config{Region: "us", ReapEvery: 5 * time.Millisecond},
			Deps{Store: st, JS: js, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// TestServiceLifecycle holds the ledger (its ATTEMPT consumer and its
// reaper) to the contract of every part, with attempts to record while it
// starts and stops.
func TestServiceLifecycle(t *testing.T) {
	_, newPart := stressLedger(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return newPart(t) })
}

// TestWarmServiceLifecycle is the same with each Stop meeting a ledger
// whose durable is consumed.
func TestWarmServiceLifecycle(t *testing.T) {
	db, newPart := stressLedger(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		s := newPart(t)
		return lifecycletest.Warm(s, s.Ready)
	})
	var rows int
	if err := db.QueryRow(t.Context(), `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 20 attempts in the ledger", rows)
}
