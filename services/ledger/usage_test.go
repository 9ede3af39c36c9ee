package ledger

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/usage"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newTestLedger is a ledger of region us on a fresh, migrated database with
// the tenants (homed in us), not started.
func newTestLedger(t *testing.T, cfg Config, tenants ...string) (*Service, *store.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	url := testenv.Database(t)
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var seeds []store.TenantSeed
	for _, id := range tenants {
		seeds = append(seeds, store.TenantSeed{ID: id, HomeRegion: "us", Token: "tok-" + id})
	}
	if err := st.SeedTenants(ctx, seeds); err != nil {
		t.Fatal(err)
	}
	tel, err := telemetry.Setup(ctx, "ledger", "us")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Deps{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	return s, st, testenv.Pool(t, url)
}

func TestUsageReportByOutcomeAndModel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, st, _ := newTestLedger(t, Config{Region: "us"}, "acme", "globex")
	w, _, err := st.InsertWork(ctx, &store.Work{ID: "w_usage", TenantID: "acme", Region: "us", Contract: "moderation",
		SchemaVersion: "1", TaxonomyVersion: "1", SourceID: "t/1", Revision: "r1", Lane: "batch", Input: `{"text":"x"}`,
		Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)}, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Hour)
	for i, r := range []struct {
		model, outcome string
		in, out, cost  int64
	}{
		{"assay-sim-1", "ok", 100, 10, 21},
		{"assay-sim-1", "invalid_output", 100, 20, 27},
		{"gpt-4o-mini", "ok", 50, 5, 11},
		{"gpt-4o-mini", "rate_limited", 0, 0, 0},
	} {
		if _, err := st.AppendLedger(ctx, store.LedgerRow{AttemptID: "00000000-0000-4000-8000-00000000000" + string(rune('1'+i)),
			TenantID: "acme", WorkID: w.ID, Model: r.model, Outcome: r.outcome, InputUnits: r.in, OutputUnits: r.out,
			CostMicros: r.cost, OccurredAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(token string) (int, usage.Report) {
		req := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		var rep usage.Report
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
				t.Fatal(err)
			}
		}
		return rec.Code, rep
	}
	code, rep := get("tok-acme")
	if code != http.StatusOK || rep.TenantID != "acme" || rep.Calls != 4 || rep.InputUnits != 250 || rep.OutputUnits != 35 || rep.CostMicros != 59 {
		t.Fatalf("HTTP %d %+v", code, rep)
	}
	wantModels := []usage.Line{
		{Model: "assay-sim-1", Calls: 2, InputUnits: 200, OutputUnits: 30, CostMicros: 48},
		{Model: "gpt-4o-mini", Calls: 2, InputUnits: 50, OutputUnits: 5, CostMicros: 11},
	}
	if !slices.Equal(rep.ByModel, wantModels) {
		t.Errorf("byModel %+v, want %+v", rep.ByModel, wantModels)
	}
	if len(rep.ByOutcome) != 3 || rep.ByOutcome[1] != (usage.Line{Outcome: "ok", Calls: 2, InputUnits: 150, OutputUnits: 15, CostMicros: 32}) {
		t.Errorf("byOutcome %+v", rep.ByOutcome)
	}
	// Another tenant sees only its own, empty, usage: arrays, not null.
	req := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer tok-globex")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("globex: HTTP %d %s", rec.Code, rec.Body)
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(rec.Body.Bytes(), &raw)
	if string(raw["byModel"]) != "[]" || string(raw["byOutcome"]) != "[]" || string(raw["calls"]) != "0" {
		t.Errorf("globex report %s", rec.Body)
	}
}

// Usage is read through the one tenant authentication: a suspended tenant
// is refused, and a tenant homed in another region is sent there.
func TestUsageRefusesSuspendedAndMisdirectedTenants(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, st, _ := newTestLedger(t, Config{Region: "us"}, "acme")
	if err := st.SeedTenants(ctx, []store.TenantSeed{{ID: "globex", HomeRegion: "eu", Token: "tok-globex"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStatus(ctx, "acme", store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token string
		code  int
		err   string
	}{
		{"tok-acme", http.StatusForbidden, `"tenant_suspended"`},
		{"tok-globex", http.StatusMisdirectedRequest, `"wrong_region"`},
		{"nope", http.StatusUnauthorized, `"unauthenticated"`},
	} {
		req := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.err) {
			t.Errorf("%s: HTTP %d %s, want %d %s", c.token, rec.Code, rec.Body, c.code, c.err)
		}
	}
}
