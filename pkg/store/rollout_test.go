package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/store"
)

// own is a version's own prompt digest, as the rollout tests ship it.
func own(v string) string { return contract.PromptDigest("the prompt of " + v) }

// shipped is code-review as the rollout tests ship it: code-review/1 by
// default.
var shipped = store.Shipped{Default: "code-review/1", OwnPrompt: own}

// finishCheck records a finished rollout check of v (with the prompt
// digest given) and returns its id.
func finishCheck(t *testing.T, ctx context.Context, s *store.Store, v store.Variant, digest string, passed bool) int64 {
	t.Helper()
	id, err := s.StartCheck(ctx, store.RolloutCheck{Contract: "code-review", SchemaVersion: v.Version, Model: v.Model,
		PromptDigest: digest, TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EndCheck(ctx, id, passed, json.RawMessage(fmt.Sprintf(`{"passed":%v}`, passed))); err != nil {
		t.Fatal(err)
	}
	return id
}

// Promote moves a route only when the last finished check of exactly the
// candidate's version, model and prompt digest passed.
func TestRolloutPromoteFence(t *testing.T) {
	s, ctx := setup(t)
	if _, err := s.SetLive(ctx, store.RouteAll, "code-review", store.Variant{Version: "code-review/1"}, shipped, "", "op"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", shipped, "", "op"); !errors.Is(err, store.ErrNotFound) {
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
	if err := s.SetCandidate(ctx, store.RouteAll, "code-review", cand, 0.2, shipped, "op"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", shipped, "", "op"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("promote never checked: %v", err)
	}
	// A passed check for another prompt, and for another model, do not count.
	finishCheck(t, ctx, s, store.Variant{Version: "code-review/2"}, otherDigest, true)
	finishCheck(t, ctx, s, store.Variant{Version: "code-review/2", Model: "gpt-x"}, own("code-review/2"), true)
	if _, _, err := s.Promote(ctx, store.RouteAll, "code-review", shipped, "", "op"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("promote with checks of other variants: %v", err)
	}
	// A failed last check refuses, even after an earlier pass.
	finishCheck(t, ctx, s, cand, own("code-review/2"), true)
	failed := finishCheck(t, ctx, s, cand, own("code-review/2"), false)
	_, _, err := s.Promote(ctx, store.RouteAll, "code-review", shipped, "", "op")
	var unchecked *store.UncheckedError
	if !errors.As(err, &unchecked) || unchecked.LastCheck != failed || unchecked.LastState != "failed" || unchecked.Variant != cand {
		t.Fatalf("promote after a failed check: %v (%+v, want check %d)", err, unchecked, failed)
	}
	// A running check does not count either way.
	if _, err := s.StartCheck(ctx, store.RolloutCheck{Contract: "code-review", SchemaVersion: cand.Version,
		PromptDigest: own("code-review/2"), TenantID: "acme"}); err != nil {
		t.Fatal(err)
	}
	passed := finishCheck(t, ctx, s, cand, own("code-review/2"), true)
	rt, ch, err := s.Promote(ctx, store.RouteAll, "code-review", shipped, "", "op")
	if err != nil || ch.CheckID != passed || ch.Verb != store.ChangePromote || rt.Live != cand || rt.Candidate != (store.Variant{}) {
		t.Fatalf("promote after a pass: %+v %+v %v", rt, ch, err)
	}
	routes, err := s.Routes(ctx)
	if err != nil || len(routes) != 1 || routes[0].Live != cand || routes[0].Candidate.Version != "" || routes[0].ShadowShare != 0 ||
		routes[0].Override != nil {
		t.Fatalf("routes after promote: %+v %v", routes, err)
	}
	checks, err := s.Checks(ctx, "code-review", 10)
	if err != nil || len(checks) != 6 || checks[0].ID != passed || checks[0].State != "passed" || checks[1].State != "running" {
		t.Fatalf("checks: %+v %v", checks, err)
	}
	// A share without a candidate, or outside [0, 1], is refused by the table.
	if err := s.SetCandidate(ctx, "acme", "code-review", store.Variant{Version: "code-review/1"}, 1.5, shipped, "op"); err == nil {
		t.Fatal("a share of 1.5 was stored")
	}
}

// Set-live is fenced as promote is: only a passed check of exactly the
// variant, the variant already live, the contract's shipped default or an
// override with a reason move live traffic. Every change is in the
// route's history, and a live variant an override put there is marked.
func TestRolloutSetLiveFence(t *testing.T) {
	s, ctx := setup(t)
	v2 := store.Variant{Version: "code-review/2"}
	setLive := func(v store.Variant, override string) (store.RouteChange, error) {
		return s.SetLive(ctx, store.RouteAll, "code-review", v, shipped, override, "op")
	}
	routes := func() []store.Route {
		t.Helper()
		rs, err := s.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}

	// Never checked: refused, naming the variant, and nothing is written.
	_, err := setLive(v2, "")
	var unchecked *store.UncheckedError
	if !errors.As(err, &unchecked) || !errors.Is(err, store.ErrCheckNotPassed) || unchecked.Variant != v2 ||
		unchecked.Digest != own("code-review/2") || unchecked.LastCheck != 0 || !strings.Contains(err.Error(), "was never checked") {
		t.Fatalf("set-live never checked: %v", err)
	}
	if rs := routes(); len(rs) != 0 {
		t.Fatalf("a refused set-live left routes %+v", rs)
	}
	// Checks of the same version with another model or prompt do not count.
	finishCheck(t, ctx, s, store.Variant{Version: "code-review/2", Model: "gpt-x"}, own("code-review/2"), true)
	finishCheck(t, ctx, s, v2, contract.PromptDigest("another prompt"), true)
	if _, err := setLive(v2, ""); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("set-live with checks of other variants: %v", err)
	}
	// A blank reason is no override.
	if _, err := setLive(v2, "  "); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("set-live with a blank override: %v", err)
	}
	// The override moves, and is recorded with who and why.
	ch, err := setLive(v2, "incident 42: code-review/1 times out")
	if err != nil || ch.Verb != store.ChangeOverride || ch.Reason != "incident 42: code-review/1 times out" || ch.CheckID != 0 ||
		ch.By != "op" || ch.From != (store.Variant{Version: "code-review/1"}) || ch.To != v2 || ch.ID == 0 {
		t.Fatalf("override: %+v %v", ch, err)
	}
	if rs := routes(); len(rs) != 1 || rs[0].Live != v2 || rs[0].Override == nil || rs[0].Override.ID != ch.ID ||
		rs[0].Override.By != "op" || rs[0].Override.Reason != ch.Reason || rs[0].Override.To != v2 {
		t.Fatalf("routes after the override: %+v", rs)
	}
	// Setting what is live already needs no check and changes nothing.
	if ch, err := setLive(v2, ""); err != nil || ch.ID != 0 {
		t.Fatalf("set-live of the live variant: %+v %v", ch, err)
	}
	if rs := routes(); rs[0].Override == nil {
		t.Fatalf("a set-live that changed nothing cleared the override mark: %+v", rs[0])
	}
	// A passed check of exactly the live variant: set-live records it, and
	// the live variant is no longer marked.
	passed := finishCheck(t, ctx, s, v2, own("code-review/2"), true)
	if ch, err := setLive(v2, ""); err != nil || ch.CheckID != passed || ch.Verb != store.ChangeSetLive {
		t.Fatalf("set-live after a pass: %+v %v", ch, err)
	}
	if rs := routes(); rs[0].Override != nil {
		t.Fatalf("the checked live variant is still marked: %+v", rs[0].Override)
	}
	// An override is kept as an override even when a check passed; a
	// reason with a passed check is no override.
	gptY := store.Variant{Version: "code-review/2", Model: "gpt-y"}
	if ch, err := setLive(gptY, "try gpt-y"); err != nil || ch.Verb != store.ChangeOverride {
		t.Fatalf("override to gpt-y: %+v %v", ch, err)
	}
	// The shipped default is always a way back; another variant that was
	// live before needs its check again.
	if ch, err := setLive(store.Variant{Version: "code-review/1"}, ""); err != nil || ch.Verb != store.ChangeSetLive || ch.CheckID != 0 {
		t.Fatalf("back to the default: %+v %v", ch, err)
	}
	if _, err := setLive(gptY, ""); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("back to gpt-y, overridden before and never checked: %v", err)
	}
	if ch, err := setLive(v2, "not needed"); err != nil || ch.Verb != store.ChangeSetLive || ch.CheckID != passed || ch.Reason != "" {
		t.Fatalf("back to the checked code-review/2: %+v %v", ch, err)
	}
	// The candidate's changes are in the history too.
	if err := s.SetCandidate(ctx, store.RouteAll, "code-review", gptY, 0.1, shipped, "op"); err != nil {
		t.Fatal(err)
	}
	// A tenant's route starts from every tenant's: the same variant moves
	// nothing, but with a passed check it is recorded.
	if ch, err := s.SetLive(ctx, "acme", "code-review", v2, shipped, "", "op"); err != nil || ch.From != v2 || ch.CheckID != passed {
		t.Fatalf("acme's set-live of every tenant's live variant: %+v %v", ch, err)
	}
	if _, err := s.SetLive(ctx, "acme", "code-review", gptY, shipped, "", "op"); !errors.Is(err, store.ErrCheckNotPassed) {
		t.Fatalf("acme's set-live of gpt-y: %v", err)
	}

	hist, err := s.RouteHistory(ctx, "code-review", 20)
	if err != nil || len(hist) != 7 || hist[0].Scope != "acme" {
		t.Fatalf("history: %+v %v", hist, err)
	}
	hist = hist[1:]
	type row struct {
		verb, to, reason string
		check            int64
	}
	var got []row
	for _, c := range hist {
		got = append(got, row{c.Verb, c.To.Label(), c.Reason, c.CheckID})
	}
	want := []row{
		{store.ChangeSetCandidate, "code-review/2 gpt-y", "", 0},
		{store.ChangeSetLive, "code-review/2", "", passed},
		{store.ChangeSetLive, "code-review/1", "", 0},
		{store.ChangeOverride, "code-review/2 gpt-y", "try gpt-y", 0},
		{store.ChangeSetLive, "code-review/2", "", passed},
		{store.ChangeOverride, "code-review/2", "incident 42: code-review/1 times out", 0},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("history, newest first:\n got %+v\nwant %+v", got, want)
	}
	for i := 1; i < len(hist); i++ {
		if hist[i].ID >= hist[i-1].ID || hist[i].At.After(hist[i-1].At) {
			t.Fatalf("history out of order: %+v", hist)
		}
	}
	// The console has each route's last changes and the override mark.
	f, err := s.Console(ctx, time.Hour, "", 5, time.Now().Add(-time.Hour))
	if err != nil || len(f.Rollouts) != 2 {
		t.Fatalf("console rollouts: %+v %v", f.Rollouts, err)
	}
	for _, r := range f.Rollouts {
		switch r.Scope {
		case "acme":
			if len(r.History) != 1 || r.Override != nil {
				t.Errorf("acme's route: %+v", r)
			}
		case store.RouteAll:
			if len(r.History) != 5 || r.History[0].Verb != store.ChangeSetCandidate || r.Override != nil {
				t.Errorf("every tenant's route: %+v", r)
			}
		}
	}
	if _, err := setLive(gptY, "gpt-y again"); err != nil {
		t.Fatal(err)
	}
	f, err = s.Console(ctx, time.Hour, "acme", 5, time.Now().Add(-time.Hour))
	if err != nil || len(f.Rollouts) != 2 {
		t.Fatalf("acme's console rollouts: %+v %v", f.Rollouts, err)
	}
	for _, r := range f.Rollouts {
		if got := r.Override != nil && r.Override.Reason == "gpt-y again"; got != (r.Scope == store.RouteAll) {
			t.Errorf("acme's console, route %s after an override of every tenant's: %+v", r.Scope, r.Override)
		}
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
