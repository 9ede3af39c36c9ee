package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// The operator's tenant commands, against a running cell: a new tenant's
// token works, a rotated one stops working and a suspended tenant gets 403
// with nothing enqueued, each once the ingress's token cache lets go.
func TestTenantCommands(t *testing.T) {
	t.Parallel()
	const cache = 300 * time.Millisecond
	b := celltest.Setup(t, cell.Options{Ingress: ingress.Config{TokenCache: cache}})
	// past posts once a GET of work that does not exist, which changes
	// nothing and passes the same admission as a post, answers token with
	// got (404 once admitted): the ingress's cache lets go of a token when
	// the database tells it of a change, or after cache when it is not
	// told, neither at a time the test can count on.
	past := func(token string, got int, req any) (int, []byte) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/work/w_none", nil)
			r.Header.Set("Authorization", "Bearer "+token)
			resp, err := b.HTTP.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == got {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET /v1/work/w_none: HTTP %d 30s after the change, want %d", resp.StatusCode, got)
			}
		}
		return b.Post(t, token, req)
	}
	ctx := context.Background()
	db := b.Cell.Env.Config.DatabaseURL
	tenant := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		args = append(args, "--region", "us", "--database-url", db)
		if err := tenantCmd(ctx, args, &out); err != nil {
			t.Fatalf("assay tenant %v: %v", args, err)
		}
		return out.String()
	}
	tokenRE := regexp.MustCompile(`token \(shown once, stored hashed[^)]*\): (\S+)`)
	out := tenant("add", "initech", "--home-region", "us", "--budget-usd", "2.5")
	first := tokenRE.FindStringSubmatch(out)
	if first == nil {
		t.Fatalf("add printed no token: %q", out)
	}
	req := celltest.CodeReview(evalset.Items()[0], "tenant commands")
	if status, raw := b.Post(t, first[1], req); status != http.StatusAccepted {
		t.Fatalf("new tenant's token: HTTP %d %s", status, raw)
	}
	if n := b.Count(t, `SELECT count(*) FROM tenant_tokens WHERE token_hash = sha256($1::bytea)`, first[1]); n != 1 {
		t.Errorf("the token is not stored as its SHA-256 (%d rows)", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM tenant_tokens WHERE position(convert_to($1, 'UTF8') in token_hash) > 0`, first[1]); n != 0 {
		t.Errorf("token text found in storage")
	}

	second := tokenRE.FindStringSubmatch(tenant("rotate-token", "initech"))
	if second == nil || second[1] == first[1] {
		t.Fatalf("rotate-token printed no new token")
	}
	if status, _ := past(first[1], http.StatusUnauthorized, req); status != http.StatusUnauthorized {
		t.Errorf("revoked token: HTTP %d past the token cache, want 401", status)
	}
	if status, _ := b.Post(t, second[1], req); status != http.StatusOK {
		t.Errorf("rotated token on a duplicate: HTTP %d, want 200", status)
	}

	tenant("suspend", "initech")
	other := req
	other.SourceID = "shop/suspended#1"
	status, raw := past(second[1], http.StatusForbidden, other)
	if status != http.StatusForbidden || !strings.Contains(string(raw), `"tenant_suspended"`) {
		t.Errorf("suspended tenant: HTTP %d %s, want 403 tenant_suspended", status, raw)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE source_id = 'shop/suspended#1'`); n != 0 {
		t.Errorf("a suspended tenant's request was stored")
	}
	tenant("resume", "initech")

	cbRE := regexp.MustCompile(`signed \(webhook-signature\) with \(shown once\): (whsec_\S+)`)
	if m := cbRE.FindStringSubmatch(tenant("callback", "initech", "--url", "https://hooks.initech.example/assay")); m == nil {
		t.Errorf("callback printed no secret")
	} else if n := b.Count(t, `SELECT count(*) FROM tenant_callbacks WHERE tenant_id = 'initech' AND secret = $1
		AND url = 'https://hooks.initech.example/assay'`, m[1]); n != 1 {
		t.Errorf("callback not stored")
	}
	tenant("callback", "initech", "--off")
	tenant("check-policy", "initech", "blocking")
	if n := b.Count(t, `SELECT count(*) FROM tenants WHERE id = 'initech' AND check_policy = 'blocking'`) +
		b.Count(t, `SELECT count(*) FROM tenant_callbacks WHERE tenant_id = 'initech'`); n != 1 {
		t.Errorf("check policy not blocking, or the callback still set")
	}
	tenant("cost-cap", "initech", "25000")
	if n := b.Count(t, `SELECT count(*) FROM tenants WHERE id = 'initech' AND work_cost_cap_micros = 25000`); n != 1 {
		t.Errorf("cost cap not 25000")
	}
	tenant("cost-cap", "initech", "off")
	if n := b.Count(t, `SELECT count(*) FROM tenants WHERE id = 'initech' AND work_cost_cap_micros IS NULL`); n != 1 {
		t.Errorf("cost cap not removed")
	}
	if status, raw := past(second[1], http.StatusNotFound, other); status != http.StatusAccepted {
		t.Errorf("resumed tenant: HTTP %d %s", status, raw)
	}

	list := tenant("list")
	if !regexp.MustCompile(`initech\s+us\s+active\s+600\s+60\s+2\.500000\s+month\s+1`).MatchString(list) {
		t.Errorf("list does not show initech with its budget and one token:\n%s", list)
	}
	tenant("set-budget", "initech", "--unlimited")
	if !regexp.MustCompile(`initech\s+us\s+active\s+600\s+60\s+unlimited`).MatchString(tenant("list")) {
		t.Errorf("set-budget --unlimited did not take")
	}
	tenant("set-rate", "initech", "--per-minute", "120", "--burst", "10")
	if !regexp.MustCompile(`initech\s+us\s+active\s+120\s+10\s+unlimited`).MatchString(tenant("list")) {
		t.Errorf("set-rate did not take")
	}
	tenant("set-weight", "initech", "--weight", "3")
	if n := b.Count(t, `SELECT count(*) FROM tenants WHERE id = 'initech' AND weight = 3`); n != 1 {
		t.Errorf("set-weight did not take")
	}

	tenant("link", "initech", "github_installation", "4242", "--repositories", "initech/*, tools/ci")
	if n := b.Count(t, `SELECT count(*) FROM tenant_sources WHERE key = '4242' AND tenant_id = 'initech'
		AND repositories = '{initech/*,tools/ci}'`); n != 1 {
		t.Errorf("link did not record the installation with its repositories")
	}
	var listed []struct {
		ID    string `json:"id"`
		Links []struct {
			Kind, Key    string
			Repositories []string
		} `json:"links"`
	}
	if err := json.Unmarshal([]byte(tenant("list", "--json")), &listed); err != nil {
		t.Fatalf("list --json: %v", err)
	}
	found := false
	for _, l := range listed {
		for _, k := range l.Links {
			found = found || (l.ID == "initech" && k.Kind == "github_installation" && k.Key == "4242" && len(k.Repositories) == 2)
		}
	}
	if !found || !strings.Contains(tenant("list"), "installation 4242 (initech/*,tools/ci)") {
		t.Errorf("list does not show initech's installation link: %+v", listed)
	}
	secretRE := regexp.MustCompile(`webhook secret \(shown once; [^)]*\): (whs_\S+)`)
	sec := secretRE.FindStringSubmatch(tenant("webhook-secret", "initech"))
	if sec == nil || b.Count(t, `SELECT count(*) FROM tenant_webhook_secrets WHERE tenant_id = 'initech' AND secret = $1`, sec[1]) != 1 {
		t.Errorf("webhook-secret printed no secret, or not the one stored")
	}

	for _, bad := range [][]string{
		{"link", "initech", "github_installation", "4242"},
		{"link", "initech", "github_installation", "-1", "--repositories", "initech/*"},
		{"link", "initech", "github_installation", "4242", "--repositories", "*/*"},
		{"link", "initech", "github_repository", "initech/*"},
		{"link", "initech", "github_repository", "initech/app", "--repositories", "initech/*"},
		{"add", "Bad.Id", "--home-region", "us"},
		{"add", "x", "--home-region", "mars"},
		{"suspend"},
		{"set-budget", "initech"},
		{"set-rate", "initech", "--per-minute", "0", "--burst", "5"},
		{"set-weight", "initech", "--weight", "0"},
		{"set-weight", "initech", "--weight", "1001"},
		{"frobnicate", "x"},
	} {
		var out bytes.Buffer
		err := tenantCmd(ctx, append(bad, "--region", "us", "--database-url", db), &out)
		if _, ok := err.(cli.ConfigError); !ok {
			t.Errorf("assay tenant %v: %v, want a usage error", bad, err)
		}
	}
	var out2 bytes.Buffer
	if err := tenantCmd(ctx, []string{"suspend", "nobody", "--region", "us", "--database-url", db}, &out2); err == nil ||
		!strings.Contains(err.Error(), `no tenant "nobody"`) {
		t.Errorf("suspending an unknown tenant: %v", err)
	}
}

// A service instance serves one region: work, results and attempts of
// another region are refused, and nothing is written for them.
func TestServicesRefuseAnotherRegion(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[6], "region refusal"))
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s", *v.Outcome)
	}
	if d := b.Cell.Classifier.Process(ctx, event.Work{WorkID: r.WorkID, TenantID: "acme", Region: "eu",
		Lane: event.Interactive, Dispatch: 9}, celltest.Delivery{}); d.Settle != consumer.Term {
		t.Errorf("classifier took work of region eu: %+v", d)
	}
	res := event.Result{AttemptID: "00000000-0000-4000-8000-0000000000aa", WorkID: r.WorkID, TenantID: "acme", Region: "eu",
		LeaseToken: "00000000-0000-4000-8000-0000000000bb", Outcome: "ok", Final: true}
	if err := b.Cell.Committer.Commit(ctx, res); err != nil {
		t.Fatal(err)
	}
	att := event.Attempt{AttemptID: "00000000-0000-4000-8000-0000000000aa", WorkID: r.WorkID, TenantID: "acme",
		Region: "eu", Model: "m", Outcome: "ok", InputUnits: 1, At: time.Now()}
	if err := b.Cell.Ledger.Append(ctx, att); err != nil {
		t.Fatal(err)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE attempt_id = '00000000-0000-4000-8000-0000000000aa'`); n != 0 {
		t.Errorf("the ledger recorded an attempt of another region")
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1`, r.WorkID); n != 1 {
		t.Errorf("attempts = %d, want 1", n)
	}
}

// One token for every cell: minted where the tenant is added first,
// installed in the other cell from a file, so the other cell knows the
// caller and answers 421 with the home region, never 401.
func TestOneTokenForEveryCell(t *testing.T) {
	t.Parallel()
	us := celltest.Setup(t, cell.Options{})
	eu := celltest.Setup(t, cell.Options{Config: config.Config{Region: "eu", Regions: config.DefaultRegions}})
	ctx := context.Background()
	tokenFile := filepath.Join(t.TempDir(), "initech.token")
	var out bytes.Buffer
	if err := tenantCmd(ctx, []string{"add", "initech", "--home-region", "us", "--token-out", tokenFile,
		"--region", "us", "--database-url", us.Cell.Env.Config.DatabaseURL}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "asy_") {
		t.Errorf("--token-out printed the token: %s", out.String())
	}
	if info, err := os.Stat(tokenFile); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v", info, err)
	}
	out.Reset()
	if err := tenantCmd(ctx, []string{"add", "initech", "--home-region", "us", "--token-from", tokenFile,
		"--region", "eu", "--database-url", eu.Cell.Env.Config.DatabaseURL}, &out); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(tokenFile)
	tok := strings.TrimSpace(string(raw))
	req := celltest.CodeReview(evalset.Items()[0], "one token")
	if status, body := eu.Post(t, tok, req); status != http.StatusMisdirectedRequest || !strings.Contains(string(body), `"us"`) &&
		!strings.Contains(string(body), " us") {
		t.Errorf("the eu cell: HTTP %d %s, want 421 naming us", status, body)
	}
	if status, body := us.Post(t, tok, req); status != http.StatusAccepted {
		t.Errorf("the us cell: HTTP %d %s, want 202", status, body)
	}
	// Adding it again is a plain refusal, not a database error.
	err := tenantCmd(ctx, []string{"add", "initech", "--home-region", "us", "--region", "us",
		"--database-url", us.Cell.Env.Config.DatabaseURL}, &out)
	if err == nil || !strings.Contains(err.Error(), "already exists") || strings.Contains(err.Error(), "23505") {
		t.Errorf("adding an existing tenant: %v", err)
	}
	// A token file that holds no token is refused before anything changes.
	bad := filepath.Join(t.TempDir(), "bad.token")
	_ = os.WriteFile(bad, []byte("…\n"), 0o600)
	if err := tenantCmd(ctx, []string{"rotate-token", "initech", "--token-from", bad, "--region", "us",
		"--database-url", us.Cell.Env.Config.DatabaseURL}, &out); err == nil {
		t.Error("rotate-token took a placeholder as a token")
	}
}

// A tenant command against a cell whose database does not exist yet says
// how to make it.
func TestTenantCommandNamesTheMissingDatabase(t *testing.T) {
	t.Parallel()
	db := freshDatabaseURL(t)
	var out bytes.Buffer
	err := tenantCmd(context.Background(), []string{"add", "acme", "--home-region", "us", "--region", "eu", "--database-url", db}, &out)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "assay migrate --create-database") {
		t.Fatalf("tenant add on a database that does not exist: %v", err)
	}
}

// A budget set after the tenant has spent part of the period counts that
// spend, and set-budget says so: set a little above it, the next work ends
// budget_exhausted without a call (it used to be let through as if nothing
// were spent); raised again mid-period, the spend is neither lost nor
// counted twice.
func TestTenantSetBudgetCountsTheSpendSoFar(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	db := b.Cell.Env.Config.DatabaseURL
	items := evalset.Items()
	submit := func(i int) ingress.WorkView {
		t.Helper()
		req := celltest.CodeReview(items[i], "spent before the budget")
		req.SourceID = fmt.Sprintf("shop/budget#%d", i)
		_, r := b.Submit(t, req)
		return b.Wait(t, r.WorkID)
	}
	for i := range 3 {
		if v := submit(i); *v.Outcome != "accepted" {
			t.Fatalf("item %d without a budget: %s (%s)", i, *v.Outcome, v.Reason)
		}
	}
	b.WaitLedger(t, "acme", int(b.Calls("acme")))
	spent := int64(b.Count(t, `SELECT sum(cost_micros)::int FROM ledger WHERE tenant_id = 'acme'`))
	setBudget := func(limit int64) string {
		t.Helper()
		var out bytes.Buffer
		if err := tenantCmd(ctx, []string{"set-budget", "acme", "--usd", strconv.FormatFloat(float64(limit)/1e6, 'f', -1, 64),
			"--period", "month", "--region", "us", "--database-url", db}, &out); err != nil {
			t.Fatalf("set-budget: %v", err)
		}
		return out.String()
	}
	month, err := b.Cell.Env.Store.PeriodStart(ctx, "month", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A tenth of one call's cost on top of the spend: no call fits.
	limit := spent + spent/30
	m := usd(spent, limit)
	out := setBudget(limit)
	if want := fmt.Sprintf("spent so far this month (since %s, from the ledger): %s of %s", month.Format(time.RFC3339), m[0], m[1]); !strings.Contains(out, want) {
		t.Fatalf("set-budget printed\n%s\nwant %q", out, want)
	}
	calls := b.Calls("acme")
	if v := submit(3); *v.Outcome != "budget_exhausted" || len(v.Attempts) != 0 || b.Calls("acme") != calls {
		t.Fatalf("work after the budget: %s after %d attempts, %d calls more; want budget_exhausted without a call",
			*v.Outcome, len(v.Attempts), b.Calls("acme")-calls)
	}
	// Raised mid-period: the same spend, and room for more calls.
	limit = 10 * spent
	if out := setBudget(limit); !strings.Contains(out, fmt.Sprintf(": %s of %s\n", usd(spent, limit)[0], usd(spent, limit)[1])) {
		t.Fatalf("set-budget again printed\n%s\nwant %s spent", out, usd(spent)[0])
	}
	if v := submit(4); *v.Outcome != "accepted" {
		t.Fatalf("work under the raised budget: %s (%s)", *v.Outcome, v.Reason)
	}
	b.WaitLedger(t, "acme", int(b.Calls("acme")))
	ledger := int64(b.Count(t, `SELECT sum(cost_micros)::int FROM ledger WHERE tenant_id = 'acme'`))
	if bud, err := b.Cell.Env.Store.CurrentBudget(ctx, "acme"); err != nil || bud.SpentMicros != ledger || bud.ReservedMicros != 0 {
		t.Fatalf("period %+v (%v); want the ledger's %d spent, nothing reserved", bud, err, ledger)
	}
}

// moveDatabases are the databases of cells us and eu, each knowing acme
// (homed in us), with work of acme in us.
func moveDatabases(t *testing.T) map[string]string {
	t.Helper()
	ctx := t.Context()
	urls := map[string]string{}
	for _, cell := range []string{"us", "eu"} {
		urls[cell] = testenv.Database(t)
		st, err := store.Open(ctx, urls[cell])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if _, err := st.Migrate(ctx); err == nil {
			err = st.AddTenant(ctx, "acme", "us", "acme-token")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(ctx, urls["us"])
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := &store.Work{ID: "w_000000000000000000000001", TenantID: "acme", Region: "us", Contract: "code-review",
		SchemaVersion: "1", TaxonomyVersion: "1", SourceID: "shop/app#1", Revision: "r1", Lane: "batch", Input: `{}`,
		Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)}
	if _, _, err := st.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	return urls
}

// A move to a cell of another region is refused before anything is held:
// the refusal names the tenant's region and the cell's, the region's
// placement map is never written (no hold, so no 503, and no placement),
// and the tenant's history stays where it is.
func TestTenantMoveToAnotherRegionIsRefusedBeforeAnythingIsHeld(t *testing.T) {
	t.Setenv("ASSAY_NATS_URL", testenv.NATS(t))
	t.Setenv("ASSAY_REGION", "us")
	ctx := context.Background()
	urls := moveDatabases(t)
	t.Setenv("ASSAY_DATABASE_URL", urls["us"])
	// The region's placement map as the command opens it, with a tenant
	// placed so that it holds something.
	var out bytes.Buffer
	if err := tenantCmd(ctx, []string{"place", "initech", "--cell", "us-2"}, &out); err != nil {
		t.Fatal(err)
	}
	cfg, err := natsOnlyCell("us")
	if err != nil {
		t.Fatal(err)
	}
	nc, js, err := connectNATS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kv, err := placement.Bucket(ctx, js, cfg.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	lastWrite := func() uint64 {
		t.Helper()
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	}
	before := lastWrite()
	for _, to := range []string{"eu", "eu-2"} {
		var stderr bytes.Buffer
		code := run([]string{"tenant", "move", "acme", "--to", to, "--to-database-url", urls["eu"]}, &stderr)
		for _, want := range []string{"tenant acme is of region us", "cell " + to + " is of region eu", "not a cell move", "nothing was held"} {
			if code != 2 || !strings.Contains(stderr.String(), want) {
				t.Fatalf("move acme --to %s: exit %d, want 2 and %q in\n%s", to, code, want, stderr.String())
			}
		}
	}
	if after := lastWrite(); after != before {
		t.Fatalf("the placement map was written %d times by refused moves", after-before)
	}
	snap, err := placement.Read(ctx, kv, "us")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Moving) != 0 || snap.CellOf("acme") != "us" {
		t.Fatalf("after the refusals: moving %v, acme on %s; want nothing held and acme on us", snap.Moving, snap.CellOf("acme"))
	}
	for cell, want := range map[string]int{"us": 1, "eu": 0} {
		if n := countIn(t, urls[cell], `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); n != want {
			t.Errorf("acme's work in %s's database: %d, want %d", cell, n, want)
		}
	}
}

// countIn runs a counting query on the database at url.
func countIn(t *testing.T, url, sql string) int {
	t.Helper()
	var n int
	if err := testenv.Pool(t, url).QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
