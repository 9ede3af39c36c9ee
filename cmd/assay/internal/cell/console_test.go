package cell_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// consoleCell is a cell whose console streams look for changes every
// 200ms, with tenant acme, tenant initech (homed here too, token in
// Initech) and an operator token (Operator) that is no tenant's.
type consoleCell struct {
	*celltest.Bundle
	Operator, Initech string
}

func setupConsole(t *testing.T) *consoleCell {
	t.Helper()
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{ConsoleEvery: 200 * time.Millisecond}})
	c := &consoleCell{Bundle: b, Operator: store.NewToken(), Initech: store.NewToken()}
	ctx := context.Background()
	if err := b.Cell.Env.Store.AddTenant(ctx, "initech", "us", c.Initech); err != nil {
		t.Fatal(err)
	}
	if err := b.Cell.Env.Store.AddOperatorToken(ctx, "ops", c.Operator); err != nil {
		t.Fatal(err)
	}
	return c
}

// get sends GET path with token ("" for none) and returns the status and
// the body.
func (c *consoleCell) get(t *testing.T, token, path string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.Cell.URL+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw
}

// console reads GET /v1/console with token.
func (c *consoleCell) console(t *testing.T, token string) ingress.Console {
	t.Helper()
	status, _, raw := c.get(t, token, "/v1/console")
	if status != http.StatusOK {
		t.Fatalf("GET /v1/console: HTTP %d %s", status, raw)
	}
	var v ingress.Console
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode /v1/console: %v: %s", err, raw)
	}
	return v
}

// quiet reads the operator's console until no consumer has a message
// pending or in hand, for at most 15s, and returns the last view: a
// delivery's ack follows its commit (the ledger's by up to its group's
// wait), so a view read right after the last row can still show it in
// hand. A consumer that never settles is left in the view for the caller
// to find.
func (c *consoleCell) quiet(t *testing.T) ingress.Console {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := c.console(t, c.Operator)
		busy := false
		for _, k := range v.Consumers {
			busy = busy || k.Pending != 0 || k.AckPending != 0
		}
		if !busy || time.Now().After(deadline) {
			return v
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finish submits evaluation item i as the tenant with token and waits for
// its outcome and its ledger row.
func (c *consoleCell) finish(t *testing.T, token, tenant string, i int, title string) string {
	t.Helper()
	req := celltest.CodeReview(evalset.Items()[i], title)
	status, raw := c.Post(t, token, req)
	if status != http.StatusAccepted {
		t.Fatalf("POST /v1/work as %s: HTTP %d %s", tenant, status, raw)
	}
	var r ingress.SubmitResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for c.Count(t, `SELECT count(*) FROM work WHERE id = $1 AND state NOT IN ('queued', 'running')`, r.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("work %s has no outcome after 60s", r.WorkID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for c.Count(t, `SELECT count(*) FROM ledger WHERE work_id = $1`, r.WorkID) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("work %s has no ledger row after 60s", r.WorkID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r.WorkID
}

// wantFigures checks v against the cell's database, counted here
// independently of the queries the console runs: the five states add up
// to the scope's work of the last day, none of it unfinished; spend is the
// ledger's sum per tenant; recent decisions are the scope's ended work.
func (c *consoleCell) wantFigures(t *testing.T, v ingress.Console, tenant string) {
	t.Helper()
	scope := `($1 = '' OR tenant_id = $1)`
	var sum int64
	for _, s := range ingress.ConsoleStates {
		n, ok := v.States[s]
		if !ok {
			t.Errorf("states lack %s: %v", s, v.States)
		}
		sum += n
	}
	if len(v.States) != len(ingress.ConsoleStates) {
		t.Errorf("states = %v, want exactly %v", v.States, ingress.ConsoleStates)
	}
	if want := c.Count(t, `SELECT count(*) FROM work WHERE created_at > now() - interval '1 day' AND `+scope, tenant); sum != int64(want) {
		t.Errorf("states add up to %d, the database holds %d work items of the last day (%v)", sum, want, v.States)
	}
	if want := c.Count(t, `SELECT count(*) FROM work WHERE state = 'schema_rejected' AND `+scope, tenant); v.States["rejected"] != int64(want) {
		t.Errorf("rejected = %d, database %d", v.States["rejected"], want)
	}
	if want := c.Count(t, `SELECT count(*) FROM work WHERE state = 'accepted' AND `+scope, tenant); v.States["accepted"]+v.States["needs_review"] != int64(want) {
		t.Errorf("accepted + needs_review = %d, database has %d accepted", v.States["accepted"]+v.States["needs_review"], want)
	}
	if v.States["running"] != 0 {
		t.Errorf("running = %d on a quiet cell", v.States["running"])
	}
	spent := map[string]int64{}
	for _, s := range v.Spend {
		spent[s.TenantID] = s.CostMicros
		want := c.Count(t, `SELECT coalesce(sum(cost_micros), 0)::int FROM ledger WHERE tenant_id = $1`, s.TenantID)
		if s.CostMicros != int64(want) || s.CostMicros == 0 {
			t.Errorf("spend of %s = %d µ$, ledger %d", s.TenantID, s.CostMicros, want)
		}
		if calls := c.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = $1`, s.TenantID); s.Calls != int64(calls) {
			t.Errorf("calls of %s = %d, ledger %d", s.TenantID, s.Calls, calls)
		}
	}
	if want := c.Count(t, `SELECT count(DISTINCT tenant_id) FROM ledger WHERE `+scope, tenant); len(spent) != want {
		t.Errorf("spend lists %v, the ledger has %d tenants in scope", spent, want)
	}
	ended := c.Count(t, `SELECT count(*) FROM work WHERE state NOT IN ('queued', 'running') AND `+scope, tenant)
	if len(v.Recent) != min(ended, ingress.ConsoleRecent) {
		t.Errorf("recent lists %d, the scope has %d ended work items", len(v.Recent), ended)
	}
	for _, d := range v.Recent {
		var state, owner string
		if err := c.DB.QueryRow(context.Background(), `SELECT state, tenant_id FROM work WHERE id = $1`, d.WorkID).Scan(&state, &owner); err != nil {
			t.Fatalf("recent %s: %v", d.WorkID, err)
		}
		if d.Outcome != state || d.TenantID != owner || (tenant != "" && owner != tenant) {
			t.Errorf("recent %s: outcome %s of %s, database %s of %s (scope %q)", d.WorkID, d.Outcome, d.TenantID, state, owner, tenant)
		}
	}
	for i := 1; i < len(v.Recent); i++ {
		if v.Recent[i].FinishedAt.After(v.Recent[i-1].FinishedAt) {
			t.Errorf("recent decisions are not newest first: %v", v.Recent)
		}
	}
	if len(v.Lanes) != 2 || v.Lanes[0].Lane != "interactive" || v.Lanes[1].Lane != "batch" {
		t.Errorf("lanes = %+v, want interactive and batch", v.Lanes)
	}
	for _, l := range v.Lanes {
		if l.Depth != 0 || l.OldestSeconds != 0 {
			t.Errorf("lane %s on a quiet cell: %+v", l.Lane, l)
		}
	}
}

// errorCode decodes the project's error document.
func errorCode(t *testing.T, raw []byte) string {
	t.Helper()
	var e apierror.Body
	if err := json.Unmarshal(raw, &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not an error document: %s", raw)
	}
	return e.Error.Code
}

// The console API: an operator sees the whole cell, consumers included; a
// tenant sees its own work and spend alone; every figure is the
// database's. The operator token is no tenant's: the tenant APIs refuse
// it.
func TestConsoleScopes(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	acme := []string{c.finish(t, c.Token, "acme", 0, "console acme 1"), c.finish(t, c.Token, "acme", 1, "console acme 2")}
	initech := c.finish(t, c.Initech, "initech", 2, "console initech")

	op := c.quiet(t)
	if op.Scope != "cell" || op.Operator != "ops" || op.Tenant != "" || op.Region != "us" {
		t.Errorf("operator's console: scope %q operator %q tenant %q region %q", op.Scope, op.Operator, op.Tenant, op.Region)
	}
	c.wantFigures(t, op, "")
	if len(op.Spend) != 2 {
		t.Errorf("operator's spend = %+v, want acme's and initech's", op.Spend)
	}
	var durables []string
	for _, k := range op.Consumers {
		durables = append(durables, k.Stream+"/"+k.Durable)
		if k.Error != "" {
			t.Errorf("consumer %s: %s", k.Durable, k.Error)
		}
		if k.Pending != 0 || k.AckPending != 0 {
			t.Errorf("consumer %s lags on a quiet cell: %+v", k.Durable, k)
		}
	}
	if want := []string{"ASSAY_WORK_US/assay-classifier-interactive", "ASSAY_WORK_US/assay-classifier-batch",
		"ASSAY_RESULT_US/assay-committer", "ASSAY_ATTEMPT_US/assay-committer", "ASSAY_ATTEMPT_US/assay-ledger",
		"ASSAY_OUTCOME_US/assay-publisher"}; !slices.Equal(durables, want) {
		t.Errorf("consumers = %v, want %v", durables, want)
	}

	mine := c.console(t, c.Token)
	if mine.Scope != "tenant" || mine.Tenant != "acme" || mine.Operator != "" {
		t.Errorf("acme's console: scope %q tenant %q operator %q", mine.Scope, mine.Tenant, mine.Operator)
	}
	c.wantFigures(t, mine, "acme")
	if len(mine.Consumers) != 0 {
		t.Errorf("a tenant sees the cell's consumers: %+v", mine.Consumers)
	}
	if len(mine.Spend) != 1 || mine.Spend[0].TenantID != "acme" {
		t.Errorf("acme's spend = %+v, want acme's alone", mine.Spend)
	}
	var seen []string
	for _, d := range mine.Recent {
		seen = append(seen, d.WorkID)
	}
	slices.Sort(seen)
	slices.Sort(acme)
	if !slices.Equal(seen, acme) {
		t.Errorf("acme's recent decisions = %v, want %v (and never initech's %s)", seen, acme, initech)
	}
	theirs := c.console(t, c.Initech)
	c.wantFigures(t, theirs, "initech")
	if len(theirs.Recent) != 1 || theirs.Recent[0].WorkID != initech {
		t.Errorf("initech's recent decisions = %+v, want %s alone", theirs.Recent, initech)
	}

	// The operator token on the tenant APIs.
	req := celltest.CodeReview(evalset.Items()[3], "operator submits")
	status, raw := c.Post(t, c.Operator, req)
	if status != http.StatusForbidden || errorCode(t, raw) != "operator_token" {
		t.Errorf("POST /v1/work with the operator token: HTTP %d %s, want 403 operator_token", status, raw)
	}
	if n := c.Count(t, `SELECT count(*) FROM work WHERE source_id = $1`, req.SourceID); n != 0 {
		t.Errorf("the operator token stored work")
	}
	for _, path := range []string{"/v1/usage", "/v1/work/" + acme[0]} {
		if status, _, raw := c.get(t, c.Operator, path); status != http.StatusForbidden || errorCode(t, raw) != "operator_token" {
			t.Errorf("GET %s with the operator token: HTTP %d %s, want 403 operator_token", path, status, raw)
		}
	}

	// Refusals, in the project's error document.
	if err := c.Cell.Env.Store.SetStatus(context.Background(), "initech", store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"no token", "", http.StatusUnauthorized, "unauthenticated"},
		{"unknown token", store.NewToken(), http.StatusUnauthorized, "unauthenticated"},
		{"suspended tenant", c.Initech, http.StatusForbidden, "tenant_suspended"},
		{"tenant homed in eu", "globex-token", http.StatusMisdirectedRequest, "wrong_region"},
	} {
		for _, path := range []string{"/v1/console", "/v1/console/events"} {
			status, _, raw := c.get(t, k.token, path)
			if status != k.status || errorCode(t, raw) != k.code {
				t.Errorf("%s on %s: HTTP %d %s, want %d %s", k.name, path, status, raw, k.status, k.code)
			}
		}
	}
	if err := c.Cell.Env.Store.RevokeOperatorToken(context.Background(), "ops"); err != nil {
		t.Fatal(err)
	}
	if status, _, raw := c.get(t, c.Operator, "/v1/console"); status != http.StatusUnauthorized || errorCode(t, raw) != "unauthenticated" {
		t.Errorf("revoked operator token: HTTP %d %s, want 401", status, raw)
	}
}

// sse is one open /v1/console/events stream.
type sse struct {
	resp *http.Response
	r    *bufio.Reader
}

func (c *consoleCell) stream(t *testing.T, ctx context.Context, token string) (*sse, int, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Cell.URL+"/v1/console/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		t.Fatalf("GET /v1/console/events: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, resp.StatusCode, raw
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sse{resp: resp, r: bufio.NewReader(resp.Body)}, resp.StatusCode, nil
}

// next reads the next event (comments skipped); "" at the end of the
// stream.
func (s *sse) next(t *testing.T) (string, []byte) {
	t.Helper()
	ev, data := "", []byte(nil)
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return "", nil
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && ev != "":
			return ev, data
		case strings.HasPrefix(line, "event: "):
			ev = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
}

// The event stream: a snapshot at once, another when work finishes, an
// error event when the credential is revoked; a credential holds a bounded
// number of streams, and a closed one gives its place back.
func TestConsoleEvents(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, status, raw := c.stream(t, ctx, c.Operator)
	if s == nil {
		t.Fatalf("events: HTTP %d %s", status, raw)
	}
	if ct := s.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	ev, data := s.next(t)
	var first ingress.Console
	if ev != "snapshot" || json.Unmarshal(data, &first) != nil || first.Scope != "cell" {
		t.Fatalf("first event %q %s, want the cell's snapshot", ev, data)
	}
	c.wantFigures(t, first, "")

	id := c.finish(t, c.Token, "acme", 0, "console events")
	for {
		ev, data := s.next(t)
		if ev != "snapshot" {
			t.Fatalf("event %q %s before the finished work showed (stream ended: %v)", ev, data, ctx.Err())
		}
		var v ingress.Console
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		if len(v.Recent) > 0 && v.Recent[0].WorkID == id && len(v.Spend) == 1 {
			c.wantFigures(t, v, "")
			break
		}
	}

	// Four streams per credential: this one and three more; a fifth is
	// refused until one closes.
	var more []*sse
	for range 3 {
		o, status, raw := c.stream(t, ctx, c.Operator)
		if o == nil {
			t.Fatalf("stream %d: HTTP %d %s", len(more)+2, status, raw)
		}
		more = append(more, o)
	}
	if o, status, raw := c.stream(t, ctx, c.Operator); o != nil || status != http.StatusTooManyRequests || errorCode(t, raw) != "too_many_streams" {
		t.Fatalf("fifth stream: HTTP %d %s, want 429 too_many_streams", status, raw)
	}
	if o, status, raw := c.stream(t, ctx, c.Token); o == nil {
		t.Errorf("a tenant's stream is refused for the operator's: HTTP %d %s", status, raw)
	}
	more[0].resp.Body.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		o, status, raw := c.stream(t, ctx, c.Operator)
		if o != nil {
			break
		}
		if status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("after closing a stream: HTTP %d %s", status, raw)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := c.Cell.Env.Store.RevokeOperatorToken(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	for {
		ev, data := s.next(t)
		if ev == "" {
			t.Fatal("the stream ended without an error event after the token was revoked")
		}
		if ev == "error" {
			if errorCode(t, data) != "unauthenticated" {
				t.Errorf("error event %s", data)
			}
			break
		}
	}
	if ev, _ := s.next(t); ev != "" {
		t.Errorf("the stream went on after its error event: %q", ev)
	}
}

// The page itself: one document, nothing loaded from anywhere, under a
// policy that allows only itself.
func TestConsolePage(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	status, h, raw := c.get(t, "", "/console")
	if status != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /console: HTTP %d %s", status, h.Get("Content-Type"))
	}
	csp := h.Get("Content-Security-Policy")
	if !strings.HasPrefix(csp, "default-src 'self';") || strings.Contains(csp, "unsafe") ||
		!regexp.MustCompile(`script-src 'sha256-[A-Za-z0-9+/]+=*'`).MatchString(csp) {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	page := string(raw)
	// A link to another page of the cell's own is not loaded, and is all it may refer to.
	if m := regexp.MustCompile(`(?i)\bsrc\s*=|\bhref\s*=\s*"(?:[^/]|//)|https?://|@import|url\(`).FindString(page); m != "" {
		t.Errorf("the page refers to something outside itself: %q", m)
	}
	if strings.Count(page, "<script>") != 1 || strings.Count(page, "<style>") != 1 {
		t.Errorf("the page should have exactly one inline script and one inline style")
	}
	if strings.Contains(page, "EventSource") || strings.Contains(page, "innerHTML") || strings.Contains(page, "localStorage") {
		t.Errorf("the page uses EventSource (no headers), innerHTML or localStorage")
	}
}

// An open console stream does not hold up the drain: it is told goodbye
// and ends as the cell stops.
func TestConsoleStreamEndsOnDrain(t *testing.T) {
	t.Parallel()
	c := setupConsole(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, status, raw := c.stream(t, ctx, c.Operator)
	if s == nil {
		t.Fatalf("events: HTTP %d %s", status, raw)
	}
	if ev, _ := s.next(t); ev != "snapshot" {
		t.Fatalf("first event %q", ev)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		c.Cell.Stop(ctx)
	}()
	for {
		ev, data := s.next(t)
		if ev == "" {
			t.Fatal("the stream ended without saying goodbye")
		}
		if ev == "bye" {
			break
		}
		if ev != "snapshot" {
			t.Fatalf("event %q %s while the cell drains", ev, data)
		}
	}
	if ev, _ := s.next(t); ev != "" {
		t.Errorf("the stream went on after goodbye: %q", ev)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("the cell did not stop within 30s with a console stream open")
	}
}
