package cell_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/host"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/schemas"
	"assay.dev/services/ingress"
)

// The description has every route the ingress serves, and the health,
// readiness and metrics routes every service has, and nothing else.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	chk, err := celltest.API()
	if err != nil {
		t.Fatal(err)
	}
	routes := append(ingress.Routes(), "GET /healthz", "GET /readyz", "GET /metrics")
	described := chk.Operations()
	for _, r := range routes {
		if !slices.Contains(described, r) {
			t.Errorf("%s is served but not described in schemas/openapi.yaml", r)
		}
	}
	for _, d := range described {
		if !slices.Contains(routes, d) {
			t.Errorf("%s is described in schemas/openapi.yaml but not served", d)
		}
	}
}

// The cell serves its description to anyone, as it is in the repository.
func TestOpenAPIIsServed(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	resp, err := b.HTTP.Get(b.Cell.URL + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, schemas.OpenAPI) ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/yaml") {
		t.Fatalf("GET /v1/openapi.yaml: HTTP %d, %s, %d bytes; want 200 and the description's %d bytes as YAML",
			resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(schemas.OpenAPI))
	}
}

// /metrics, which names tenants and their outcomes, is served on the
// cell's metrics listener alone: the API's port answers it 404.
func TestMetricsOnlyOnTheirListener(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	if b.Cell.MetricsURL == "" || b.Cell.MetricsURL == b.Cell.URL {
		t.Fatalf("metrics at %q, the API at %s: want a listener of their own", b.Cell.MetricsURL, b.Cell.URL)
	}
	for base, want := range map[string]int{b.Cell.URL: http.StatusNotFound, b.Cell.MetricsURL: http.StatusOK} {
		resp, err := b.HTTP.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusOK) != bytes.Contains(body, []byte("assay_build_info")) {
			t.Errorf("GET %s/metrics: HTTP %d, want %d:\n%.300s", base, resp.StatusCode, want, body)
		}
	}
}

// apiCoverage fails a run of the whole package in which a cell never gave
// an answer the description lists (an operation's status, and for an
// error each of its codes), unless notYetExercised names it. An answer
// the list names that a test gave after all is printed, not failed: some
// on the list come of timing (a slow body, a cut connection), and a run
// must not fail because one of them happened. A run of some tests (-run,
// -skip) cannot be asked for every answer and is not held to it.
func apiCoverage(code int) int {
	if code != 0 || flag.Lookup("test.run").Value.String() != "" || flag.Lookup("test.skip").Value.String() != "" {
		return code
	}
	chk, err := celltest.API()
	if err != nil {
		fmt.Fprintln(os.Stderr, "OpenAPI coverage:", err)
		return 1
	}
	seen := chk.Seen()
	described := map[string]bool{}
	var missing, stale []string
	for _, a := range chk.Described() {
		described[a.String()] = true
		_, was := seen[a]
		switch {
		case !was && !notYetExercised[a.String()]:
			missing = append(missing, a.String())
		case was && notYetExercised[a.String()]:
			stale = append(stale, a.String()+" (a test gives it now)")
		}
	}
	for a := range notYetExercised {
		if !described[a] {
			missing = append(missing, a+", which notYetExercised names and the description does not have")
		}
	}
	sort.Strings(stale)
	sort.Strings(missing)
	for _, a := range missing {
		fmt.Fprintf(os.Stderr, "OpenAPI coverage: no test gave %s\n", a)
	}
	for _, a := range stale {
		fmt.Fprintf(os.Stderr, "OpenAPI coverage: notYetExercised names %s: take it off the list\n", a)
	}
	given := 0
	for _, a := range chk.Described() {
		if seen[a] > 0 {
			given++
		}
	}
	fmt.Fprintf(os.Stderr, "OpenAPI coverage: %d of %d described answers given, %d named not yet given\n",
		given, len(chk.Described()), len(notYetExercised))
	if len(missing) > 0 {
		return 1
	}
	return code
}

// notYetExercised are the answers the description lists that no test of
// this package gives yet; each is checked against the description where
// another package's test gives it through a cell (cmd/assay's webhook
// tests), or at the handler (services/ingress), or not at all, as said.
var notYetExercised = map[string]bool{
	// A connection that breaks in the middle of its body: no client is
	// left to read the answer.
	"POST /v1/work 400 bad_request": true, "POST /v1/batches 400 bad_request": true,
	"POST /v1/reviews/{id}/resolve 400 bad_request": true, "POST /v1/webhooks/github 400 bad_request": true,
	"POST /v1/console/work/{id}/actions 400 bad_request": true, "POST /v1/console/reviews/{id}/resolve 400 bad_request": true,
	// A body slower than the read timeout: TestSlowBodiesAreCut gives the
	// webhook's; the API's slow bodies there end before an answer is read.
	"POST /v1/work 408 request_timeout": true, "POST /v1/batches 408 request_timeout": true,
	"POST /v1/reviews/{id}/resolve 408 request_timeout": true, "POST /v1/console/work/{id}/actions 408 request_timeout": true,
	"POST /v1/console/reviews/{id}/resolve 408 request_timeout": true,
	// Capacity admission's refusal under load (services/ingress's shedding
	// tests, at the handler; bench goodput 6 through a cell).
	"POST /v1/work 429 over_capacity": true,
	// A registry that fails.
	"GET /metrics 500": true,
	// A delivery from a tenant's installation: cmd/assay's burst and size
	// tests post them through a cell (and so are checked), services/ingress's
	// webhook tests give each refusal at the handler.
	"POST /v1/webhooks/github 202": true, "POST /v1/webhooks/github 403 repository_not_covered": true,
	"POST /v1/webhooks/github 403 tenant_suspended": true, "POST /v1/webhooks/github 409 delivery_conflict": true,
	"POST /v1/webhooks/github 421 wrong_region": true, "POST /v1/webhooks/github 421 wrong_cell": true, "POST /v1/webhooks/github 422 invalid_diff": true,
	"POST /v1/webhooks/github 502 upstream_unavailable": true, "POST /v1/webhooks/github 503 unavailable": true,
}

// apiCall is one request of the conformance test.
type apiCall struct {
	method, path string
	body         any
	header       map[string]string
}

// Each answer the description lists for refusing a caller — no token, an
// operator's token on a tenant's API, a suspended tenant's, another
// region's tenant's, a database that does not answer the token lookup —
// is given by every operation that lists it, and nothing else is; so are
// the listings' refusals of a bad query and the refusals of a body too
// large, a diff too large, a bad deadline, a second event stream and a
// tenant over its rate. Each answer is checked against the description
// by the cell's checker as it is given.
func TestEveryDescribedRefusal(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{TokenCache: time.Millisecond, EventStreams: 1, MaxDiffBytes: 8 << 10}})
	ctx := context.Background()
	chk, err := celltest.API()
	if err != nil {
		t.Fatal(err)
	}
	st := b.Cell.Env.Store
	if err := st.SeedTenants(ctx, []store.TenantSeed{
		{ID: "dormant", HomeRegion: "us", Token: "dormant-token"},
		{ID: "slow", HomeRegion: "us", Token: "slow-token"},
		{ID: "elsewhere", HomeRegion: "us", Token: "elsewhere-token"},
	}); err != nil {
		t.Fatal(err)
	}
	// A tenant of a cell of the region that has not said where it answers:
	// refused 421 wrong_cell, as nothing can be sent on to it.
	kv, err := placement.Bucket(ctx, b.Cell.Env.JS, b.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "elsewhere", "us-9"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStatus(ctx, "dormant", store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	if err := st.AddOperatorToken(ctx, "ops", "ops-token"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetRate(ctx, "slow", 1, 1); err != nil {
		t.Fatal(err)
	}
	review := celltest.CodeReview(evalset.Items()[0], "conformance")
	batch := map[string]any{"contract": review.Contract, "items": []map[string]any{
		{"itemId": "a", "sourceId": "shop/conformance#1", "revision": "r1", "input": review.Input}}}
	resolve := map[string]string{"verdict": "approved"}
	calls := map[string]apiCall{
		"POST /v1/work":                 {body: review},
		"GET /v1/work":                  {},
		"GET /v1/work/{id}":             {path: "/v1/work/w_none"},
		"GET /v1/work/{id}/events":      {path: "/v1/work/w_none/events"},
		"POST /v1/batches":              {body: batch},
		"GET /v1/batches/{id}":          {path: "/v1/batches/b_none"},
		"GET /v1/batches/{id}/results":  {path: "/v1/batches/b_none/results"},
		"GET /v1/batches/{id}/events":   {path: "/v1/batches/b_none/events"},
		"POST /v1/batches/{id}/cancel":  {path: "/v1/batches/b_none/cancel"},
		"DELETE /v1/batches/{id}":       {path: "/v1/batches/b_none"},
		"GET /v1/reviews":               {},
		"POST /v1/reviews/{id}/resolve": {path: "/v1/reviews/rv_000000000000000000000000/resolve", body: resolve},
		"GET /v1/views":                 {},
		"GET /v1/usage":                 {},
		"GET /v1/console":               {},
		"GET /v1/console/events":        {},
		"GET /v1/console/work/{id}":     {path: "/v1/console/work/w_none"},
		"GET /v1/console/work":          {},
		"POST /v1/console/work/{id}/actions": {path: "/v1/console/work/w_none/actions",
			body: map[string]string{"action": "redrive", "confirm": "w_none"}},
		"GET /v1/console/reviews":               {},
		"GET /v1/console/reviews/{id}":          {path: "/v1/console/reviews/rv_000000000000000000000000"},
		"POST /v1/console/reviews/{id}/claim":   {path: "/v1/console/reviews/rv_000000000000000000000000/claim"},
		"POST /v1/console/reviews/{id}/resolve": {path: "/v1/console/reviews/rv_000000000000000000000000/resolve", body: map[string]string{"verdict": "dismissed"}},
	}
	send := func(op string, c apiCall, token string) (int, string) {
		t.Helper()
		method, path, _ := strings.Cut(op, " ")
		if c.path != "" {
			path = c.path
		}
		var body io.Reader
		if raw, ok := c.body.([]byte); ok {
			body = bytes.NewReader(raw)
		} else if c.body != nil {
			raw, _ := json.Marshal(c.body)
			body = bytes.NewReader(raw)
		}
		req, _ := http.NewRequestWithContext(ctx, method, b.Cell.URL+path, body)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e struct{ Error struct{ Code string } }
		_ = json.Unmarshal(raw, &e)
		return resp.StatusCode, e.Error.Code
	}
	expect := func(op string, c apiCall, token string, status int, code string) {
		t.Helper()
		if got, gotCode := send(op, c, token); got != status || gotCode != code {
			t.Errorf("%s: HTTP %d %q, want %d %q", op, got, gotCode, status, code)
		}
	}
	// The refusals of a caller, wherever the description lists them.
	byToken := map[string]string{"401 unauthenticated": "", "403 operator_token": "ops-token",
		"403 tenant_suspended": "dormant-token", "421 wrong_region": "globex-token", "421 wrong_cell": "elsewhere-token"}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, code := send("GET /v1/views", apiCall{}, "elsewhere-token"); got == 421 && code == "wrong_cell" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the placement of elsewhere on us-9 is not heard within 20s: HTTP %d %s", got, code)
		}
	}
	for _, a := range chk.Described() {
		c, ok := calls[a.Op]
		token, refusal := byToken[fmt.Sprintf("%d %s", a.Status, a.Code)]
		if ok && refusal {
			expect(a.Op, c, token, a.Status, a.Code)
		}
	}
	// A tenant over its rate: the first is taken, the second refused.
	for i, want := range []int{202, 429} {
		r := review
		r.SourceID = fmt.Sprintf("shop/slow#%d", i)
		code := map[int]string{429: "rate_limited"}[want]
		expect("POST /v1/work", apiCall{body: r}, "slow-token", want, code)
	}
	expect("GET /v1/work", apiCall{}, b.Token, 200, "")
	// Refusals of what was asked.
	expect("GET /v1/work", apiCall{path: "/v1/work?state=sideways"}, b.Token, 400, "invalid_query")
	expect("GET /v1/views", apiCall{path: "/v1/views?window=1s"}, b.Token, 400, "invalid_query")
	expect("GET /v1/usage", apiCall{path: "/v1/usage?from=yesterday"}, b.Token, 400, "invalid_time")
	expect("GET /v1/usage", apiCall{path: "/v1/usage?from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z"}, b.Token, 400, "invalid_period")
	expect("GET /v1/usage", apiCall{path: "/v1/usage?tenant=slow"}, b.Token, 403, "forbidden")
	expect("GET /v1/work/{id}", calls["GET /v1/work/{id}"], b.Token, 404, "not_found")
	expect("GET /v1/console/work/{id}", calls["GET /v1/console/work/{id}"], "ops-token", 404, "not_found")
	expect("GET /v1/console/work", apiCall{path: "/v1/console/work?source=has%20space"}, "ops-token", 400, "invalid_query")
	expect("GET /v1/console/work", apiCall{path: "/v1/console/work?tenant=slow"}, b.Token, 403, "forbidden")
	expect("GET /v1/console/work", apiCall{path: "/v1/console/work?tenant=slow"}, "ops-token", 200, "")
	// Acting on work: only an operator token of role operator, confirmed.
	act := func(body any) apiCall {
		return apiCall{path: "/v1/console/work/w_none/actions", body: body}
	}
	if err := st.AddOperatorTokenAs(ctx, "reader", store.RoleReviewer, "reader-token"); err != nil {
		t.Fatal(err)
	}
	const actOp = "POST /v1/console/work/{id}/actions"
	redrive := map[string]string{"action": "redrive", "confirm": "w_none"}
	expect(actOp, act(redrive), b.Token, 403, "forbidden")
	expect(actOp, act(redrive), "reader-token", 403, "forbidden")
	expect(actOp, act(redrive), "ops-token", 404, "not_found")
	expect(actOp, act(map[string]string{"action": "delete", "confirm": "w_none"}), "ops-token", 400, "invalid_action")
	expect(actOp, act(map[string]string{"action": "redrive", "confirm": "w_other"}), "ops-token", 400, "unconfirmed")
	expect(actOp, act(map[string]string{"action": "redrive", "confirm": "w_none", "note": strings.Repeat("n", 1001)}), "ops-token", 400, "invalid_note")
	expect(actOp, act([]byte(`{"action": "redrive",`)), "ops-token", 400, "invalid_json")
	expect(actOp, act([]byte("{\"action\": \"redrive\x00\", \"confirm\": \"w_none\"}")), "ops-token", 400, "invalid_input")
	expect(actOp, act(map[string]string{"action": "redrive", "confirm": "w_none", "note": strings.Repeat("n", 20<<10)}), "ops-token", 413, "payload_too_large")
	// The review screen's refusals of what was asked.
	const deskOp = "POST /v1/console/reviews/{id}/resolve"
	desk := func(body any) apiCall {
		return apiCall{path: "/v1/console/reviews/rv_000000000000000000000000/resolve", body: body}
	}
	expect("GET /v1/console/reviews", apiCall{path: "/v1/console/reviews?state=sideways"}, "reader-token", 400, "invalid_query")
	expect("POST /v1/console/reviews/{id}/claim", calls["POST /v1/console/reviews/{id}/claim"], "reader-token", 404, "not_found")
	expect(deskOp, desk(map[string]string{"verdict": "dismissed"}), "reader-token", 404, "not_found")
	expect(deskOp, desk(map[string]string{"verdict": "maybe"}), "reader-token", 400, "invalid_verdict")
	expect(deskOp, desk(map[string]string{"verdict": "dismissed", "note": strings.Repeat("n", 4001)}), "reader-token", 400, "invalid_note")
	expect(deskOp, desk([]byte(`{"verdict": `)), "reader-token", 400, "invalid_json")
	expect(deskOp, desk([]byte("{\"verdict\": \"dismissed\x00\"}")), "reader-token", 400, "invalid_input")
	expect(deskOp, desk(map[string]string{"verdict": "dismissed", "note": strings.Repeat("n", 300<<10)}), "reader-token", 413, "payload_too_large")
	done := review
	done.SourceID = "shop/conformance#done"
	status, sub := b.Submit(t, done)
	if status != 202 {
		t.Fatalf("submit: HTTP %d", status)
	}
	b.Wait(t, sub.WorkID)
	expect(actOp, apiCall{path: "/v1/console/work/" + sub.WorkID + "/actions",
		body: map[string]string{"action": "redrive", "confirm": sub.WorkID}}, "ops-token", 409, "not_actionable")
	late := review
	late.DeadlineSeconds = -1
	expect("POST /v1/work", apiCall{body: late}, b.Token, 400, "invalid_deadline")
	lateBatch := map[string]any{"contract": review.Contract, "deadlineSeconds": -1, "items": batch["items"]}
	expect("POST /v1/batches", apiCall{body: lateBatch}, b.Token, 400, "invalid_deadline")
	for _, bad := range []struct{ field, value, code string }{
		{"sourceId", "has space", "invalid_source_id"}, {"revision", strings.Repeat("r", 300), "invalid_revision"}} {
		item := map[string]any{"itemId": "a", "sourceId": "shop/conformance#2", "revision": "r1", "input": review.Input}
		item[bad.field] = bad.value
		expect("POST /v1/batches", apiCall{body: map[string]any{"contract": review.Contract, "items": []any{item}}}, b.Token, 400, bad.code)
	}
	big := review
	big.SourceID = "shop/conformance#big"
	var in map[string]any
	if err := json.Unmarshal(review.Input, &in); err != nil {
		t.Fatal(err)
	}
	in["diff"] = in["diff"].(string) + strings.Repeat("+x\n", 4<<10)
	big.Input, _ = json.Marshal(in)
	expect("POST /v1/work", apiCall{body: big}, b.Token, 413, "diff_too_large")
	expect("POST /v1/batches", apiCall{body: map[string]any{"contract": review.Contract, "items": []map[string]any{
		{"itemId": "a", "sourceId": "shop/conformance#big", "revision": "r1", "input": big.Input}}}}, b.Token, 413, "diff_too_large")
	many := make([]map[string]any, ingress.MaxBatchItems+1)
	for i := range many {
		many[i] = map[string]any{"itemId": fmt.Sprintf("i%d", i), "input": map[string]any{}}
	}
	expect("POST /v1/batches", apiCall{body: map[string]any{"contract": review.Contract, "items": many}}, b.Token, 400, "too_many_items")
	huge := map[string]string{"verdict": "approved", "note": strings.Repeat("n", 64<<10)}
	expect("POST /v1/reviews/{id}/resolve", apiCall{path: "/v1/reviews/rv_000000000000000000000000/resolve", body: huge}, b.Token, 413, "payload_too_large")
	expect("POST /v1/batches", apiCall{body: map[string]any{"contract": review.Contract, "items": []map[string]any{
		{"itemId": "a", "sourceId": "s", "revision": "r", "input": map[string]string{"pad": strings.Repeat("p", 5<<20)}}}}}, b.Token, 413, "payload_too_large")
	expect("POST /v1/reviews/{id}/resolve", apiCall{path: "/v1/reviews/rv_000000000000000000000000/resolve",
		body: map[string]string{"verdict": "approved", "note": strings.Repeat("n", 4001)}}, b.Token, 400, "invalid_note")
	expect("POST /v1/reviews/{id}/resolve", apiCall{path: "/v1/reviews/rv_000000000000000000000000/resolve",
		body: []byte("{\"note\": \"reviewer\x00\", \"verdict\": \"approved\"}")}, b.Token, 400, "invalid_input")
}

// Where the database does not answer a token's lookup, every operation
// that lists 503 unavailable gives it.
func TestEveryDescribedUnavailable(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	chk, err := celltest.API()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(b.Cell.Env.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	name := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	admin := testenv.Pool(t, testenv.PostgresURL(t))
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "ALTER DATABASE "+name+" ALLOW_CONNECTIONS true") })
	b.DB.Close()
	for _, q := range []string{"ALTER DATABASE " + name + " ALLOW_CONNECTIONS false",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, strings.TrimPrefix(u.Path, "/"))
		}
		if _, err := admin.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	asked := 0
	for _, a := range chk.Described() {
		if a.Status != 503 || a.Code != "unavailable" || strings.Contains(a.Op, "webhooks") {
			continue
		}
		method, path, _ := strings.Cut(a.Op, " ")
		path = strings.NewReplacer("{id}", "x_none").Replace(path)
		req, _ := http.NewRequestWithContext(ctx, method, b.Cell.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+store.NewToken()) // never cached: it is looked up
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", a.Op, err)
		}
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 503 || e.Error.Code != "unavailable" {
			t.Errorf("%s with the database refusing: HTTP %d %q, want 503 unavailable", a.Op, resp.StatusCode, e.Error.Code)
		}
		asked++
	}
	if asked < 10 {
		t.Errorf("only %d operations list 503 unavailable", asked)
	}
}

// While a service starts, every operation that lists 503 starting gives
// it, /healthz says it is alive and /readyz that it is not ready.
func TestEveryDescribedStarting(t *testing.T) {
	t.Parallel()
	chk, err := celltest.API()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var problems []string
	srv := httptest.NewServer(chk.Wrap(host.Starting(), func(p string) {
		mu.Lock()
		problems = append(problems, p)
		mu.Unlock()
	}))
	defer srv.Close()
	asked := 0
	for _, a := range chk.Described() {
		if a.Status != 503 || a.Code != "starting" && a.Op != "GET /readyz" {
			continue
		}
		method, path, _ := strings.Cut(a.Op, " ")
		path = strings.NewReplacer("{id}", "x_none").Replace(path)
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("%s while starting: HTTP %d, want 503", a.Op, resp.StatusCode)
		}
		asked++
	}
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || asked < 10 {
		t.Errorf("/healthz while starting: HTTP %d; %d operations list 503 starting", resp.StatusCode, asked)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("OpenAPI: %s", p)
	}
}

// The webhook's answers that need no installation: its headers' refusals,
// a body over the cap, a payload that is not JSON, an event that is not
// reviewed (200), and a delivery from an installation no tenant has.
func TestEveryDescribedWebhookRefusal(t *testing.T) {
	t.Parallel()
	const secret = "conformance-secret"
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{GitHubSecret: secret}})
	post := func(body []byte, header map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/webhooks/github", bytes.NewReader(body))
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(body)
		for k, v := range map[string]string{"Content-Type": "application/json", "X-GitHub-Event": "pull_request",
			"X-GitHub-Delivery": "d-conformance", "X-Hub-Signature-256": "sha256=" + hex.EncodeToString(mac.Sum(nil))} {
			req.Header.Set(k, v)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code
	}
	pr := []byte(`{"action":"opened","number":1,"installation":{"id":991199},"repository":{"full_name":"nobody/here"},` +
		`"pull_request":{"number":1,"title":"t","updated_at":"2026-12-05T00:00:00Z","head":{"sha":"0123456789abcdef0123456789abcdef01234567"},"base":{"sha":"89abcdef0123456789abcdef0123456789abcdef"}}}`)
	for _, c := range []struct {
		name   string
		body   []byte
		header map[string]string
		status int
		code   string
	}{
		{"form-encoded", pr, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"bad delivery id", pr, map[string]string{"X-GitHub-Delivery": "not a delivery id"}, 400, "invalid_delivery"},
		{"bad event", pr, map[string]string{"X-GitHub-Event": "Pull Request"}, 400, "invalid_event"},
		{"too large", bytes.Repeat([]byte(" "), 9<<20), nil, 413, "payload_too_large"},
		{"not text", []byte("{\"action\":\"opened\x00\"}"), nil, 400, "invalid_payload"},
		{"an event not reviewed", []byte(`{"zen":"hello"}`), map[string]string{"X-GitHub-Event": "ping"}, 200, ""},
		{"no tenant's installation", pr, nil, 404, "unknown_installation"},
	} {
		if status, code := post(c.body, c.header); status != c.status || code != c.code {
			t.Errorf("%s: HTTP %d %q, want %d %q", c.name, status, code, c.status, c.code)
		}
	}
}

// A tenant at its cap of open event streams is refused another, a work's
// or a batch's, with 429 too_many_streams.
func TestEveryDescribedStreamRefusal(t *testing.T) {
	t.Parallel()
	// No classifier: the work stays queued, so its stream stays open.
	b := celltest.Setup(t, cell.Options{NoClassifier: true, Ingress: ingress.Config{EventStreams: 1}})
	status, sr := b.Submit(t, celltest.CodeReview(evalset.Items()[0], "streams"))
	if status != 202 {
		t.Fatalf("submit: HTTP %d", status)
	}
	review := celltest.CodeReview(evalset.Items()[1], "streams")
	raw, _ := json.Marshal(map[string]any{"contract": review.Contract, "items": []map[string]any{
		{"itemId": "a", "sourceId": "shop/streams#2", "revision": "r1", "input": review.Input}}})
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/batches", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var batch struct{ BatchID string }
	_ = json.NewDecoder(resp.Body).Decode(&batch)
	resp.Body.Close()
	if resp.StatusCode != 202 || batch.BatchID == "" {
		t.Fatalf("batch: HTTP %d", resp.StatusCode)
	}
	open := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		resp, err := (&http.Client{}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	first := open("/v1/work/" + sr.WorkID + "/events")
	defer first.Body.Close()
	if first.StatusCode != 200 {
		t.Fatalf("first stream: HTTP %d", first.StatusCode)
	}
	if _, err := bufio.NewReader(first.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/work/" + sr.WorkID + "/events", "/v1/batches/" + batch.BatchID + "/events"} {
		resp := open(path)
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 429 || e.Error.Code != "too_many_streams" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s with the tenant's one stream open: HTTP %d %q, Retry-After %q; want 429 too_many_streams with Retry-After",
				path, resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"))
		}
	}
}

// A tenant's lane at its backlog cap refuses more work, a work item's or a
// batch's, with 429 backlog_full and a Retry-After; a batch over the
// tenant's rate is refused with 429 rate_limited.
func TestEveryDescribedBacklogRefusal(t *testing.T) {
	t.Parallel()
	// No classifier: what is queued stays queued, so the backlog stays full.
	b := celltest.Setup(t, cell.Options{NoClassifier: true,
		Ingress: ingress.Config{Shed: ingress.ShedConfig{InteractiveBacklog: 1, BatchBacklog: 1}}})
	ctx := context.Background()
	if err := b.Cell.Env.Store.SeedTenants(ctx, []store.TenantSeed{{ID: "slow", HomeRegion: "us", Token: "slow-token"}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Cell.Env.Store.SetRate(ctx, "slow", 1, 1); err != nil {
		t.Fatal(err)
	}
	post := func(path, token string, body any) (int, string, string) {
		t.Helper()
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")
	}
	items := evalset.Items()
	first, second := celltest.CodeReview(items[0], "backlog 1"), celltest.CodeReview(items[1], "backlog 2")
	if status, code, _ := post("/v1/work", b.Token, first); status != 202 {
		t.Fatalf("the first work: HTTP %d %s", status, code)
	}
	if status, code, retry := post("/v1/work", b.Token, second); status != 429 || code != "backlog_full" || retry == "" {
		t.Errorf("work past the interactive backlog: HTTP %d %s, Retry-After %q; want 429 backlog_full with Retry-After", status, code, retry)
	}
	batch := func(n int, tag string) map[string]any {
		var its []map[string]any
		for i := range n {
			r := celltest.CodeReview(items[i], "")
			its = append(its, map[string]any{"itemId": fmt.Sprintf("%s%d", tag, i), "sourceId": fmt.Sprintf("shop/%s#%d", tag, i),
				"revision": r.Revision, "input": r.Input})
		}
		return map[string]any{"contract": first.Contract, "items": its}
	}
	if status, code, retry := post("/v1/batches", b.Token, batch(2, "over")); status != 429 || code != "backlog_full" || retry == "" {
		t.Errorf("a batch past the batch backlog: HTTP %d %s, Retry-After %q; want 429 backlog_full", status, code, retry)
	}
	if status, code, _ := post("/v1/batches", "slow-token", batch(1, "slowa")); status != 202 {
		t.Fatalf("the slow tenant's first batch: HTTP %d %s", status, code)
	}
	if status, code, retry := post("/v1/batches", "slow-token", batch(1, "slowb")); status != 429 || code != "rate_limited" || retry == "" {
		t.Errorf("a batch over the tenant's rate: HTTP %d %s, Retry-After %q; want 429 rate_limited", status, code, retry)
	}
}
