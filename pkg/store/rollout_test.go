package store_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/store"
)

// Promote moves a route only when the last finished check of exactly the
// candidate's version, model and prompt digest passed.
func TestPromoteFence(t *testing.T) {
	s, ctx := setup(t)
	own := func(v string) string { return contract.PromptDigest("the prompt of " + v) }
	if err := s.SetLive(ctx, store.RouteAll, "code-review", store.Variant{Version: "code-review/1"}, "op"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", own, "op"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("promote without a candidate: %v", err)
	}
	other := "other prompt text"
	otherDigest := contract.PromptDigest(other)
	if err := s.PutPrompt(ctx, "code-review", otherDigest, other); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Prompt(ctx, otherDigest); err != nil || got != other {
		t.Fatalf("prompt: %q %v", got, err)
	}
	if _, err := s.Prompt(ctx, contract.PromptDigest("never stored")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown prompt: %v", err)
	}
	cand := store.Variant{Version: "code-review/2"}
	if err := s.SetCandidate(ctx, store.RouteAll, "code-review", store.Variant{}, cand, 0.2, "op"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", own, "op"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("promote never checked: %v", err)
	}
	check := func(v store.Variant, digest string, passed bool) int64 {
		id, err := s.StartCheck(ctx, store.RolloutCheck{Contract: "code-review", SchemaVersion: v.Version, Model: v.Model,
			PromptDigest: digest, TenantID: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EndCheck(ctx, id, passed, json.RawMessage(`{"passed":`+map[bool]string{true: "true", false: "false"}[passed]+`}`)); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// A passed check for another prompt, and for another model, do not count.
	check(store.Variant{Version: "code-review/2"}, otherDigest, true)
	check(store.Variant{Version: "code-review/2", Model: "gpt-x"}, own("code-review/2"), true)
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", own, "op"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("promote with checks of other variants: %v", err)
	}
	// A failed last check refuses, even after an earlier pass.
	check(cand, own("code-review/2"), true)
	failed := check(cand, own("code-review/2"), false)
	_, id, err := s.Promote(ctx, store.RouteAll, "code-review", own, "op")
	if !errors.Is(err, store.ErrCheckNotPassed) || id != failed {
		t.Fatalf("promote after a failed check: %v (check %d, want %d)", err, id, failed)
	}
	// A running check does not count either way.
	if _, err := s.StartCheck(ctx, store.RolloutCheck{Contract: "code-review", SchemaVersion: cand.Version,
		PromptDigest: own("code-review/2"), TenantID: "acme"}); err != nil {
		t.Fatal(err)
	}
	passed := check(cand, own("code-review/2"), true)
	rt, id, err := s.Promote(ctx, store.RouteAll, "code-review", own, "op")
	if err != nil || id != passed || rt.Live != cand || rt.Candidate != (store.Variant{}) {
		t.Fatalf("promote after a pass: %+v %d %v", rt, id, err)
	}
	routes, err := s.Routes(ctx)
	if err != nil || len(routes) != 1 || routes[0].Live != cand || routes[0].Candidate.Version != "" || routes[0].ShadowShare != 0 {
		t.Fatalf("routes after promote: %+v %v", routes, err)
	}
	checks, err := s.Checks(ctx, "code-review", 10)
	if err != nil || len(checks) != 6 || checks[0].ID != passed || checks[0].State != "passed" || checks[1].State != "running" {
		t.Fatalf("checks: %+v %v", checks, err)
	}
	// A share without a candidate, or outside [0, 1], is refused by the table.
	if err := s.SetCandidate(ctx, "acme", "code-review", cand, store.Variant{Version: "code-review/1"}, 1.5, "op"); err == nil {
		t.Fatal("a share of 1.5 was stored")
	}
}

// Shadow work carries its variant, is read back with its live twin, and
// its ledger rows are marked shadow.
func TestShadowWork(t *testing.T) {
	s, ctx := setup(t)
	prompt := "a prompt of the candidate"
	digest := contract.PromptDigest(prompt)
	if err := s.PutPrompt(ctx, "pr-review", digest, prompt); err != nil {
		t.Fatal(err)
	}
	live := insert(t, ctx, s, newWork("acme", "shop/x#1", "r1"))
	sh := newWork("acme", "shadow:2:shop/x#1", "r1")
	sh.SchemaVersion, sh.Model, sh.PromptDigest, sh.ShadowOf = "2", "gpt-candidate", digest, live.ID
	got := insert(t, ctx, s, sh)
	if got.Model != "gpt-candidate" || got.PromptDigest != digest || got.ShadowOf != live.ID {
		t.Fatalf("shadow work read back as %+v", got)
	}
	if w, err := s.GetWork(ctx, live.ID); err != nil || w.Model != "" || w.PromptDigest != "" || w.ShadowOf != "" {
		t.Fatalf("live work read back as %+v, %v", w, err)
	}
	bad := newWork("acme", "shop/x#2", "r1")
	bad.PromptDigest = contract.PromptDigest("never stored")
	if _, _, err := s.InsertWork(ctx, bad, announce); err == nil {
		t.Fatal("work naming an unknown prompt was stored")
	}
	runs, err := s.ShadowRuns(ctx, "pr-review", "", time.Now().Add(-time.Hour), 10)
	if err != nil || len(runs) != 1 || runs[0].Work.ID != got.ID || runs[0].Live == nil || runs[0].Live.ID != live.ID {
		t.Fatalf("shadow runs: %+v %v", runs, err)
	}
}
