package committer

import (
	"testing"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

func TestScreen(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ev   event.Result
		want action
	}{
		{"valid answer", event.Result{Region: "us", Outcome: outcome.AttemptOK, Final: true}, check},
		{"final invalid answer", event.Result{Region: "us", Outcome: outcome.AttemptInvalidOutput, Final: true}, check},
		{"invalid answer with a repair to follow", event.Result{Region: "us", Outcome: outcome.AttemptInvalidOutput}, record},
		{"rate limited", event.Result{Region: "us", Outcome: outcome.AttemptRateLimited, Final: true}, record},
		{"transport rejected", event.Result{Region: "us", Outcome: outcome.AttemptTransportRejected, Final: true}, record},
		{"stale answer", event.Result{Region: "us", Outcome: outcome.AttemptStaleLease, Final: true}, record},
		{"another cell's result", event.Result{Region: "eu", Outcome: outcome.AttemptOK, Final: true}, refuse},
	}
	for _, c := range cases {
		if got, _ := screen(c.ev, "us"); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestTriage(t *testing.T) {
	t.Parallel()
	ok := event.Result{WorkID: "w_1", TenantID: "acme", Region: "us", Outcome: outcome.AttemptOK, Final: true}
	invalid := ok
	invalid.Outcome, invalid.Reason = outcome.AttemptInvalidOutput, "gate: schema.violation: findings[0]"
	running := &store.Work{ID: "w_1", TenantID: "acme", State: outcome.Running, Contract: "code-review"}
	accepted := &store.Work{ID: "w_1", TenantID: "acme", State: outcome.Accepted, Contract: "code-review"}
	expired := &store.Work{ID: "w_1", TenantID: "acme", State: outcome.Expired, Contract: "code-review"}
	other := &store.Work{ID: "w_1", TenantID: "globex", State: outcome.Running, Contract: "code-review"}
	cases := []struct {
		name   string
		ev     event.Result
		w      *store.Work
		known  bool
		want   action
		reason string
	}{
		{"answer for running work", ok, running, true, check, ""},
		{"work not in this cell", ok, nil, true, refuse, "result names work this cell does not have for that tenant"},
		{"another tenant's work", ok, other, true, refuse, "result names work this cell does not have for that tenant"},
		{"work already accepted", ok, accepted, true, markStale, "work already accepted"},
		{"work expired", ok, expired, true, markStale, "work already expired"},
		{"final invalid answer", invalid, running, true, reject, invalid.Reason},
		{"contract unknown here", ok, running, false, reject, `contract "code-review" is not known to this committer`},
	}
	for _, c := range cases {
		got, reason := triage(c.ev, c.w, c.known)
		if got != c.want || reason != c.reason {
			t.Errorf("%s: %d %q, want %d %q", c.name, got, reason, c.want, c.reason)
		}
	}
}

// The verdict words, one per thing the store's guarded statements can have
// done: committed, late, lost, rejected, duplicate, stale.
func TestVerdicts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		got  verdict
		word string
	}{
		{"committed", committed(store.Committed), outcome.Accepted},
		{"late", committed(store.Late), outcome.Expired},
		{"lost before commit", committed(store.Lost), outcome.AttemptStaleLease},
		{"rejected", rejected(true, "gate: x"), outcome.SchemaRejected},
		{"lost before the rejection", rejected(false, "gate: x"), outcome.AttemptStaleLease},
		{"redelivered verdict", marked(false, outcome.Accepted), "duplicate"},
		{"second answer", marked(true, outcome.Accepted), outcome.AttemptStaleLease},
	}
	for _, c := range cases {
		if c.got.word != c.word || c.got.reason == "" {
			t.Errorf("%s: %+v, want %s with a reason", c.name, c.got, c.word)
		}
	}
	if r := rejected(true, "gate: schema.violation: x"); r.reason != "gate: schema.violation: x" {
		t.Errorf("a rejection's reason is the gate's: %q", r.reason)
	}
}
