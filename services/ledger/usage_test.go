package ledger

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/store"
	"assay.dev/pkg/usage"
)

// getUsage asks s for GET /v1/usage with the token.
func getUsage(s *Service, token string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	return rec
}

func TestUsageReportByOutcomeAndModel(t *testing.T) {
	t.Parallel()
	s, m, _ := newMemLedger(t, Config{Region: "us"})
	m.Tenant("acme", "us", "tok-acme")
	m.Tenant("globex", "us", "tok-globex")
	m.Claim(claimFact{Tenant: "acme", Work: "w_usage", Attempt: attemptN(100), Lease: time.Minute})
	at := time.Now().Add(-time.Hour)
	var rows []store.LedgerRow
	for i, r := range []struct {
		model, outcome string
		in, out, cost  int64
	}{
		{"assay-sim-1", "ok", 100, 10, 21},
		{"assay-sim-1", "invalid_output", 100, 20, 27},
		{"gpt-4o-mini", "ok", 50, 5, 11},
		{"gpt-4o-mini", "rate_limited", 0, 0, 0},
	} {
		rows = append(rows, store.LedgerRow{AttemptID: attemptN(i + 1), TenantID: "acme", WorkID: "w_usage", Model: r.model,
			Outcome: r.outcome, InputUnits: r.in, OutputUnits: r.out, CostMicros: r.cost, OccurredAt: at})
	}
	for i, r := range m.RecordLedgerBatch(t.Context(), rows) {
		if r.Recorded != store.Inserted {
			t.Fatalf("row %d: %+v", i, r)
		}
	}
	rec := getUsage(s, "tok-acme")
	var rep usage.Report
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.TenantID != "acme" || rep.Calls != 4 || rep.InputUnits != 250 || rep.OutputUnits != 35 || rep.CostMicros != 59 {
		t.Fatalf("report %+v", rep)
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
	rec = getUsage(s, "tok-globex")
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
// is refused, a tenant homed in another region is sent there, and a
// database that does not answer is a refusal worth retrying.
func TestUsageRefusesSuspendedAndMisdirectedTenants(t *testing.T) {
	t.Parallel()
	s, m, _ := newMemLedger(t, Config{Region: "us"})
	m.Tenant("acme", "us", "tok-acme")
	m.Tenant("globex", "eu", "tok-globex")
	m.Suspend("acme")
	for _, c := range []struct {
		token string
		code  int
		err   string
	}{
		{"tok-acme", http.StatusForbidden, `"tenant_suspended"`},
		{"tok-globex", http.StatusMisdirectedRequest, `"wrong_region"`},
		{"nope", http.StatusUnauthorized, `"unauthenticated"`},
	} {
		if rec := getUsage(s, c.token); rec.Code != c.code || !strings.Contains(rec.Body.String(), c.err) {
			t.Errorf("%s: HTTP %d %s, want %d %s", c.token, rec.Code, rec.Body, c.code, c.err)
		}
	}
	m.Down()
	if rec := getUsage(s, "tok-globex"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"unavailable"`) {
		t.Errorf("database down: HTTP %d %s, want 503 unavailable", rec.Code, rec.Body)
	}
}
