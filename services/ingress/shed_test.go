package ingress

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/event"
)

// report puts a classifier's capacity report into the cell's bucket and
// waits until ingress has read it.
func (e *webhookEnv) report(r admission.CapacityReport) {
	e.t.Helper()
	ctx := e.t.Context()
	kv, err := e.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: event.Names{Cell: "us"}.CapacityBucket(),
		History: 1, TTL: time.Minute, Storage: jetstream.MemoryStorage})
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(r)
	if _, err := kv.Put(ctx, "classifier.test", b); err != nil {
		e.t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; {
		if e.svc.CapacityKnown() {
			return
		}
		if time.Now().After(end) {
			e.t.Fatal("ingress never read the capacity report")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A cell whose interactive lane holds five seconds of work at the rate it
// serves refuses more interactive work at once: 429 over_capacity with
// Retry-After, nothing stored; a webhook is stored dropped with its rerun
// command; batch work still queues; a duplicate still answers as one.
func TestSubmitOverCapacity(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.Shed.QueueWait = time.Second })
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusAccepted {
		t.Fatalf("before any report: %d %s, want admitted", a.status, a.body)
	}
	e.report(admission.CapacityReport{Instance: "test", At: time.Now().Add(time.Hour), Every: time.Hour, Rate: 10,
		Limit: 4, InFlight: 4, Latency: 100 * time.Millisecond,
		Lanes: map[string]admission.LaneLoad{event.Interactive: {Held: 50, Tenants: map[string]admission.TenantLoad{"acme": {Held: 50, Weight: 1}}}}})
	a, h := e.submitAPI("ticket-2", "interactive")
	if a.status != http.StatusTooManyRequests || a.code() != "over_capacity" {
		t.Fatalf("over capacity: %d %s, want 429 over_capacity", a.status, a.body)
	}
	// The refusal speaks of this work alone: nothing of how much the
	// lane holds or whose it is.
	if strings.Contains(string(a.body), "waiting in the lane") || strings.Contains(string(a.body), "tenant") {
		t.Fatalf("the refusal tells of the lane: %s", a.body)
	}
	secs, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || secs < 3 || secs > 5 {
		t.Fatalf("Retry-After %q, want the 4 s until the lane drains to a second", h.Get("Retry-After"))
	}
	if n := e.count(`SELECT count(*) FROM work WHERE source_id = 'ticket-2'`); n != 0 {
		t.Fatalf("refused work stored: %d rows", n)
	}
	e.decision(WorkID("acme", "moderation", "ticket-2", "r1"), "refused")
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusOK || !a.work().Duplicate {
		t.Fatalf("duplicate over capacity: %d %s, want 200 duplicate", a.status, a.body)
	}
	if a, _ := e.submitAPI("sweep-1", "batch"); a.status != http.StatusAccepted {
		t.Fatalf("batch is not refused for capacity: %d %s", a.status, a.body)
	}
	d := e.deliver("pull_request", "d-open", readPayload(t, "pull_request_opened.json"))
	r := d.work()
	id := WorkID("acme", WebhookContract, prSource, headOpened)
	if d.status != http.StatusAccepted || r.State != "dropped" || !strings.Contains(r.Reason, "at capacity") ||
		!strings.Contains(r.Reason, "ask again with: assay work rerun "+id+" --region us") {
		t.Fatalf("webhook over capacity: %d %s, want dropped with its rerun command", d.status, d.body)
	}
	e.decision(id, "dropped")
}

// Batch work is bounded per tenant: beyond its backlog, 429 backlog_full.
func TestBatchBacklogFull(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, func(c *Config) { c.Shed.BatchBacklog = 2 })
	for _, src := range []string{"sweep-1", "sweep-2"} {
		if a, _ := e.submitAPI(src, "batch"); a.status != http.StatusAccepted {
			t.Fatalf("%s within the backlog: %d %s", src, a.status, a.body)
		}
	}
	a, h := e.submitAPI("sweep-3", "batch")
	if a.status != http.StatusTooManyRequests || a.code() != "backlog_full" || h.Get("Retry-After") == "" {
		t.Fatalf("beyond the backlog: %d %s (Retry-After %q), want 429 backlog_full", a.status, a.body, h.Get("Retry-After"))
	}
	if a, _ := e.submitAPI("ticket-1", "interactive"); a.status != http.StatusAccepted {
		t.Fatalf("interactive has no batch backlog: %d %s", a.status, a.body)
	}
}
