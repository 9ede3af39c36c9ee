package cell_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// failingModel stands in front of the provider: while down, every call
// that names model is answered 500 without reaching the provider; every
// call is counted by the model it names and by its tenant.
type failingModel struct {
	model string
	down  atomic.Bool

	mu       sync.Mutex
	byModel  map[string]int
	byTenant map[string]int
}

func (f *failingModel) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model string `json:"model"`
			User  string `json:"user"`
		}
		_ = json.Unmarshal(body, &req)
		f.mu.Lock()
		f.byModel[req.Model]++
		f.byTenant[req.User]++
		f.mu.Unlock()
		if req.Model == f.model && f.down.Load() {
			http.Error(w, `{"error":{"message":"internal error","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

func (f *failingModel) calls(model string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byModel[model]
}

func (f *failingModel) tenantCalls(tenant string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byTenant[tenant]
}

// routeReads counts ingress's reads of the contracts' routes: a route set
// before a read begins is in force once the read after it begins.
type routeReads struct{ n atomic.Int64 }

func (r *routeReads) tracer(service string) pgx.QueryTracer {
	if service != "ingress" {
		return nil
	}
	return r
}

func (r *routeReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM contract_routes ORDER BY") {
		r.n.Add(1)
	}
	return ctx
}

func (*routeReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A rollout candidate on a second model that answers 500 to every call
// opens its own circuit and no other: its shadow work waits for the
// candidate's probes (none of it ends, none of it touches live work),
// while live work on the cell's model is claimed, called and accepted the
// whole time. When the candidate answers again its circuit closes and its
// shadow work ends; the ledger holds a row for every call the provider
// counted, per tenant and per model.
func TestCandidateModelOpensOnlyItsCircuit(t *testing.T) {
	t.Parallel()
	const liveModel, candidate = "assay-sim-1", "assay-sim-candidate"
	cc := classifier.CircuitConfig{Failures: 3, ProbeEvery: 100 * time.Millisecond, ProbeMax: 500 * time.Millisecond}
	p := &failingModel{model: candidate, byModel: map[string]int{}, byTenant: map[string]int{}}
	p.down.Store(true)
	reads := &routeReads{}
	b := celltest.SetupFront(t, cell.Options{Classifier: classifier.Config{Circuit: cc},
		Ingress: ingress.Config{RoutesEvery: 100 * time.Millisecond}, StoreTracer: reads.tracer}, p.front)
	ctx := t.Context()
	st := b.Cell.Env.Store
	opToken := store.NewToken()
	if err := st.AddOperatorToken(ctx, "ops", opToken); err != nil {
		t.Fatal(err)
	}
	reg := b.Cell.Env.Contracts
	def, _ := reg.Get("code-review")
	shipped := store.Shipped{Default: def.SchemaVersion, OwnPrompt: func(v string) string {
		if c, ok := reg.Of("code-review", v); ok {
			return c.PromptDigest
		}
		return ""
	}}
	if err := st.SetCandidate(ctx, store.RouteAll, "code-review", store.Variant{Version: def.SchemaVersion, Model: candidate}, 1,
		shipped, "test"); err != nil {
		t.Fatal(err)
	}
	from := reads.n.Load()
	waitUntil(t, "ingress to read the routes twice", func() bool { return reads.n.Load() >= from+2 })

	items := evalset.Items()
	submit := func(phase string, n int) []string {
		ids := make([]string, n)
		for i := range n {
			req := celltest.CodeReview(items[i%len(items)], phase)
			req.SourceID = fmt.Sprintf("shop/%s#%d", phase, i+1)
			_, r := b.Submit(t, req)
			ids[i] = r.WorkID
		}
		return ids
	}
	accepted := func(ids []string) {
		t.Helper()
		for _, id := range ids {
			if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
				t.Fatalf("live work %s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
			}
		}
	}
	circuitState := func(model string) string {
		t.Helper()
		c, err := st.GetCircuit(ctx, model)
		if err != nil {
			t.Fatal(err)
		}
		return c.State
	}

	// Every live item has a twin on the candidate; their failures open
	// the candidate's circuit.
	first := submit("before", 6)
	waitUntil(t, "the candidate's circuit to open", func() bool { return circuitState(candidate) == store.CircuitOpen })
	accepted(first)
	if s := circuitState(liveModel); s != store.CircuitClosed {
		t.Fatalf("the cell's model's circuit is %s after the candidate's failures", s)
	}
	if v := metricValue(t, b, "assay_provider_circuit_open", `model="`+candidate+`"`); v != 1 {
		t.Errorf("assay_provider_circuit_open{model=%q} = %v, want 1", candidate, v)
	}
	if v := metricValue(t, b, "assay_provider_circuit_open", `model="`+liveModel+`"`); v != 0 {
		t.Errorf("assay_provider_circuit_open{model=%q} = %v, want 0", liveModel, v)
	}
	con := consoleOf(t, b, opToken)
	if len(con.Circuits) != 1 || con.Circuits[0].Model != candidate || con.Circuits[0].State != store.CircuitOpen {
		t.Errorf("console circuits = %+v, want the candidate's alone, open", con.Circuits)
	}

	// While it is open, live work goes on: every item is accepted, and the
	// candidate's circuit is still open after the last of them.
	candidateCalls := p.calls(candidate)
	during := submit("during", 10)
	accepted(during)
	if s := circuitState(candidate); s != store.CircuitOpen {
		t.Fatalf("the candidate's circuit is %s after the live work it let through; the test wants it open throughout", s)
	}
	n := b.Count(t, `SELECT count(*) FROM work WHERE shadow_of = ANY($1)`, during)
	ended := b.Count(t, `SELECT count(*) FROM work WHERE shadow_of = ANY($1) AND state = ANY($2)`, during, outcome.Terminal)
	if n != len(during) || ended != 0 {
		t.Fatalf("%d twins of the %d live items made during the outage, %d of them ended; want all made, none ended",
			n, len(during), ended)
	}
	t.Logf("%d calls to the candidate up to its circuit's opening, %d more (its probes) while %d live items were accepted",
		candidateCalls, p.calls(candidate)-candidateCalls, len(during))

	// The candidate answers again: its circuit closes, its shadow work
	// ends, and nothing of it was published or reviewed.
	p.down.Store(false)
	waitUntil(t, "the candidate's circuit to close", func() bool { return circuitState(candidate) == store.CircuitClosed })
	waitUntil(t, "the shadow work to end", func() bool {
		return b.Count(t, `SELECT count(*) FROM work WHERE shadow_of IS NOT NULL AND NOT (state = ANY($1))`, outcome.Terminal) == 0
	})
	if n := b.Count(t, `SELECT count(*) FROM reviews r JOIN work w ON w.id = r.work_id WHERE w.shadow_of IS NOT NULL`); n != 0 {
		t.Errorf("%d review items for shadow work", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM publications p JOIN work w ON w.id = p.work_id WHERE w.shadow_of IS NOT NULL`); n != 0 {
		t.Errorf("%d publications of shadow work", n)
	}
	if v := metricValue(t, b, "assay_provider_circuit_open", `model="`+candidate+`"`); v != 0 {
		t.Errorf("assay_provider_circuit_open{model=%q} = %v after recovery, want 0", candidate, v)
	}

	// Ledger = provider calls: per tenant, and per model.
	calls := p.tenantCalls("acme")
	b.WaitLedger(t, "acme", calls)
	for _, m := range []string{liveModel, candidate} {
		if rows := b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme' AND model = $1`, m); rows != p.calls(m) {
			t.Errorf("model %s: %d provider calls, %d ledger rows", m, p.calls(m), rows)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE shadow <> (model = $1)`, candidate); n != 0 {
		t.Errorf("%d ledger rows whose shadow mark is not their model's", n)
	}
	t.Logf("%d live items accepted, %d of them while the candidate's circuit was open; %d provider calls (%d to the candidate) = %d ledger rows",
		len(first)+len(during), len(during), calls, p.calls(candidate), calls)
}
