package ingress

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// submitAPI posts a moderation request for source as tenant acme.
func (e *webhookEnv) submitAPI(source, lane string) (answer, http.Header) {
	e.t.Helper()
	body := `{"contract":"moderation","sourceId":"` + source + `","revision":"r1","lane":"` + lane + `","input":{"text":"hello"}}`
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/work", bytes.NewBufferString(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, body: buf.Bytes()}, resp.Header
}

// Over its rate, an API caller gets 429 with Retry-After and a JSON error,
// nothing is stored; a key already accepted still answers as a duplicate;
// the other lane has its own bucket.
func TestSubmitOverRate(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	if err := e.st.SetRate(t.Context(), "acme", 1, 2); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"ticket-1", "ticket-2"} {
		if a, _ := e.submitAPI(src, "interactive"); a.status != http.StatusAccepted {
			t.Fatalf("%s within the burst: %d %s", src, a.status, a.body)
		}
	}
	a, h := e.submitAPI("ticket-3", "interactive")
	if a.status != http.StatusTooManyRequests || a.code() != "rate_limited" {
		t.Fatalf("over the rate: %d %s, want 429 rate_limited", a.status, a.body)
	}
	// One token a minute: the next is just under 60 s away.
	secs, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || secs < 59 || secs > 60 {
		t.Fatalf("Retry-After %q, want 59-60 s", h.Get("Retry-After"))
	}
	if !strings.Contains(string(a.body), "rate of 1 per minute") {
		t.Fatalf("message does not name the rate: %s", a.body)
	}
	if n := e.count(`SELECT count(*) FROM work WHERE source_id = 'ticket-3'`); n != 0 {
		t.Fatalf("refused work stored: %d rows", n)
	}
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusOK || !a.work().Duplicate {
		t.Fatalf("duplicate over the rate: %d %s, want 200 duplicate", a.status, a.body)
	}
	if a, _ := e.submitAPI("sweep-1", "batch"); a.status != http.StatusAccepted {
		t.Fatalf("batch lane has its own bucket: %d %s", a.status, a.body)
	}
	e.decision(WorkID("acme", "moderation", "ticket-3", "r1"), "refused")
}

// Over its rate, webhook work is stored dropped with the command that asks
// again; that command queues it.
func TestWebhookOverRateDropped(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	if err := e.st.SetRate(t.Context(), "acme", 1, 1); err != nil {
		t.Fatal(err)
	}
	first := e.deliver("pull_request", "d-open", readPayload(t, "pull_request_opened.json"))
	if first.status != http.StatusAccepted || first.work().State != "queued" {
		t.Fatalf("opened: %d %s", first.status, first.body)
	}
	e.gh.setDiff(prSource, evalDiff(t, "07-coupon-twice"))
	second := e.deliver("pull_request", "d-sync", readPayload(t, "pull_request_synchronize.json"))
	r := second.work()
	id := WorkID("acme", WebhookContract, prSource, headSync)
	want := "ask again with: assay work rerun " + id + " --region us"
	if second.status != http.StatusAccepted || r.State != "dropped" || !strings.Contains(r.Reason, want) {
		t.Fatalf("over the rate: %d %s, want dropped naming %q", second.status, second.body, want)
	}
	w, err := e.st.GetWork(t.Context(), id)
	if err != nil || w.State != "dropped" || !strings.Contains(w.Reason, want) {
		t.Fatalf("stored %+v %v", w, err)
	}
	e.decision(id, "dropped")
	if msgs := e.published(); len(msgs) != 1 {
		t.Fatalf("dropped work was announced: %+v", msgs)
	}
	// The same delivery again is the same dropped work, not a second row.
	if again := e.deliver("pull_request", "d-sync", readPayload(t, "pull_request_synchronize.json")); again.work().WorkID != id {
		t.Fatalf("redelivery: %s", again.body)
	}

	dropped := w.Dispatch
	w, err = e.st.Rerun(t.Context(), id, time.Now().Add(time.Minute), Announce(t.Context(), event.Names{Cell: "us"}))
	if err != nil || w.State != "queued" || w.Dispatch != dropped+1 {
		t.Fatalf("rerun: state %q dispatch %d (dropped at %d) %v", w.State, w.Dispatch, dropped, err)
	}
	if msgs := e.published(); len(msgs) != 2 || msgs[1].WorkID != id || msgs[1].Dispatch != w.Dispatch {
		t.Fatalf("after rerun the WORK stream holds %+v", msgs)
	}
	if _, err := e.st.Rerun(t.Context(), id, time.Now().Add(time.Minute), Announce(t.Context(), event.Names{Cell: "us"})); !errors.Is(err, store.ErrNotDropped) {
		t.Fatalf("second rerun: %v, want ErrNotDropped", err)
	}
}

// One tenant authentication for every entry point: a suspended tenant is
// refused on the work API and on webhooks alike, and nothing is stored.
func TestSuspendedTenantRefusedEverywhere(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	if err := e.st.SetStatus(t.Context(), "acme", store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusForbidden || a.code() != "tenant_suspended" {
		t.Fatalf("work API: %d %s, want 403 tenant_suspended", a.status, a.body)
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/work/"+WorkID("acme", "moderation", "ticket-1", "r1"), nil)
	req.Header.Set("Authorization", "Bearer tok-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("GET /v1/work: %d, want 403", resp.StatusCode)
	}
	if a := e.deliver("pull_request", "d-suspended", readPayload(t, "pull_request_opened.json")); a.status != http.StatusForbidden ||
		a.code() != "tenant_suspended" {
		t.Fatalf("webhook: %d %s, want 403 tenant_suspended", a.status, a.body)
	}
	e.nothingStored()
}

// Ids the caller chose reach the log only as digests: a source id (or a
// delivery id) can hold a name or an address, and logs leave the cell.
func TestCallerChosenIDsAreLoggedAsDigests(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	const source = "ticket-jane.doe-at-example-com"
	if a, _ := e.submitAPI(source, "interactive"); a.status != http.StatusAccepted {
		t.Fatalf("submit: %d %s", a.status, a.body)
	}
	d := e.decision(WorkID("acme", "moderation", source, "r1"), "queued")
	if d["source"] != telemetry.Opaque(source) || d["revision"] != telemetry.Opaque("r1") {
		t.Errorf("decision %v: want the source and revision as digests", d)
	}
	if a := e.deliver("pull_request", "jane-doe-ssn-078-05-1120", readPayload(t, "pull_request_opened.json"), "sha256="+strings.Repeat("0", 64)); a.status != http.StatusUnauthorized {
		t.Fatalf("a delivery with a bad signature: %d %s", a.status, a.body)
	}
	e.log.mu.Lock()
	logged := e.log.b.String()
	e.log.mu.Unlock()
	if !strings.Contains(logged, "webhook signature refused") {
		t.Fatalf("the refused delivery was not logged:\n%s", logged)
	}
	if strings.Contains(logged, "jane") {
		t.Errorf("a caller-chosen id is in the log verbatim:\n%s", logged)
	}
}

// post sends body to path as acme.
func (e *webhookEnv) post(path, body string) (answer, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, body: buf.Bytes()}, resp.Header
}

func batchBody(key string, ids ...string) string {
	var items []string
	for _, id := range ids {
		items = append(items, `{"itemId":"`+id+`","input":{"text":"hello `+id+`"}}`)
	}
	k := ""
	if key != "" {
		k = `"batchKey":"` + key + `",`
	}
	return `{"contract":"moderation",` + k + `"items":[` + strings.Join(items, ",") + `]}`
}

// One backlog rule for every way work enters: a batch counts all its
// items against the tenant's batch backlog as single submissions do, and
// a webhook meets the interactive backlog as a submission does.
func TestOneBacklogRule(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.Shed.BatchBacklog, c.Shed.InteractiveBacklog = 3, 1 })
	for _, src := range []string{"sweep-1", "sweep-2"} {
		if a, _ := e.submitAPI(src, "batch"); a.status != http.StatusAccepted {
			t.Fatalf("%s within the backlog: %d %s", src, a.status, a.body)
		}
	}
	a, h := e.post("/v1/batches", batchBody("", "b-1", "b-2"))
	if a.status != http.StatusTooManyRequests || a.code() != "backlog_full" || h.Get("Retry-After") == "" {
		t.Fatalf("a batch of two beside two open: %d %s, want 429 backlog_full", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM work WHERE source_id LIKE 'b-%'`); n != 0 {
		t.Fatalf("the refused batch stored %d items", n)
	}
	if a, _ := e.post("/v1/batches", batchBody("fits", "b-3")); a.status != http.StatusAccepted {
		t.Fatalf("a batch of one that fits: %d %s", a.status, a.body)
	}
	// Asked for again, the accepted batch is the same batch, full or not.
	if a, _ := e.post("/v1/batches", batchBody("fits", "b-3")); a.status != http.StatusOK {
		t.Fatalf("the same batch again at a full backlog: %d %s, want 200", a.status, a.body)
	}
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusAccepted {
		t.Fatalf("the first interactive item: %d %s", a.status, a.body)
	}
	if a, _ := e.submitAPI("ticket-2", "interactive"); a.status != http.StatusTooManyRequests || a.code() != "backlog_full" {
		t.Fatalf("a second interactive item over a backlog of one: %d %s", a.status, a.body)
	}
	d := e.deliver("pull_request", "d-backlog", readPayload(t, "pull_request_opened.json"))
	if r := d.work(); d.status != http.StatusAccepted || r.State != "dropped" || !strings.Contains(r.Reason, "backlog is full") ||
		!strings.Contains(r.Reason, "ask again with: assay work rerun") {
		t.Fatalf("a webhook over the interactive backlog: %d %s, want dropped with its rerun command", d.status, d.body)
	}
}

// A request over its rate is refused before its body is read for more than
// its size: an invalid batch, a repeated batchKey and a submission whose
// input its schema would refuse all get 429, not the work of decoding.
func TestRateTokenBeforeTheBody(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	if err := e.st.SetRate(t.Context(), "acme", 1, 1); err != nil {
		t.Fatal(err)
	}
	if a, _ := e.post("/v1/batches", batchBody("k-1", "a")); a.status != http.StatusAccepted {
		t.Fatalf("the first batch: %d %s", a.status, a.body)
	}
	for name, body := range map[string]string{
		"an invalid body":          `{"contract":"moderation","nope":` + strings.Repeat(`{"x":1,`, 1000),
		"the same batchKey":        batchBody("k-1", "a"),
		"an input of unknown keys": `{"contract":"moderation","items":[{"itemId":"a","input":{` + strings.Repeat(`"k":1,`, 10) + `}}]}`,
	} {
		if a, h := e.post("/v1/batches", body); a.status != http.StatusTooManyRequests || a.code() != "rate_limited" || h.Get("Retry-After") == "" {
			t.Errorf("%s over the batch lane's rate: %d %s, want 429 rate_limited", name, a.status, a.body)
		}
	}
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusAccepted {
		t.Fatalf("the first submission: %d %s", a.status, a.body)
	}
	bad := `{"contract":"moderation","sourceId":"t-2","revision":"r1","input":{"text":"hi","extra":"not in the schema"}}`
	if a, _ := e.post("/v1/work", bad); a.status != http.StatusTooManyRequests || a.code() != "rate_limited" {
		t.Fatalf("an input its schema refuses, over the rate: %d %s, want 429 rate_limited", a.status, a.body)
	}
}
