package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
)

// assay work show prints the work's review item and every act on it with
// who did it, of which kind and through which route.
func TestPrintStorySaysWhoActed(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	resolved := at.Add(time.Minute)
	s := &WorkStory{Story: &story.Story{
		Work: story.WorkRow{ID: "w_0123456789abcdef01234567", State: "schema_rejected"},
		Actions: []store.WorkAction{
			{Action: store.ActionClaim, By: "dev", Kind: store.ActorReviewer, Route: store.RouteConsole, At: at},
			{Action: store.ActionResolve, By: "acme", Kind: store.ActorTenant, Route: store.RouteAPI, Note: "dismissed", At: resolved},
		},
		Review: &api.WorkReview{ReviewView: api.ReviewView{ReviewID: "rv_0123456789abcdef01234567", Reason: "schema_rejected",
			State: "resolved", Verdict: "dismissed", Resolution: "dismissed by tenant acme via the API", ResolvedAt: &resolved}},
	}}
	var out bytes.Buffer
	if err := printStory(&out, s); err != nil {
		t.Fatal(err)
	}
	// The columns' widths aside, these lines are printed.
	text := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"review rv_0123456789abcdef01234567 schema_rejected resolved verdict dismissed",
		"resolved dismissed by tenant acme via the API at 2026-03-01T12:01:00Z",
		"2026-03-01T12:00:00Z claim by reviewer dev via the console", "2026-03-01T12:01:00Z resolve by tenant acme via the API dismissed"} {
		if !strings.Contains(text, want) {
			t.Errorf("work show lacks %q:\n%s", want, out.String())
		}
	}
}

// assay work show says what a person's resolution made of the work: the
// work counts as accepted once a reviewer amended and published its
// answer, and the review section gives the verdict, who gave it (the
// reviewer the credential named), when, and what was published; the JSON
// carries the published answer and the one state.
func TestWorkShowSaysWhoResolvedAndWhatWasPublished(t *testing.T) {
	t.Parallel()
	st, url := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	ctx := t.Context()
	w, _, err := st.InsertWork(ctx, &store.Work{ID: "w_00112233445566778899aabb", TenantID: "acme", Region: "us", Contract: "code-review",
		SchemaVersion: "code-review/2", TaxonomyVersion: "2026-11", SourceID: "shop/app#9", Revision: "r1", Lane: "interactive",
		Input: `{"diff":""}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)}, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Pool(t, url).Exec(ctx, `UPDATE work SET state = 'schema_rejected', reason = 'schema.violation' WHERE id = $1`, w.ID); err != nil {
		t.Fatal(err)
	}
	ana := store.Actor{Kind: store.ActorReviewer, ID: "ana", Route: store.RouteConsole}
	published := `{"changeId": "w_00112233445566778899aabb", "findings": [{"file": "a.go", "line": 3}], "schemaVersion": 2}`
	if _, err := st.ResolveReview(ctx, "", w.ID, store.Resolution{By: ana, Verdict: store.VerdictAmended, Note: "line moved",
		Output: []byte(published)}); err != nil {
		t.Fatal(err)
	}
	show := func(args ...string) string {
		var out bytes.Buffer
		if err := workShow(ctx, append([]string{w.ID, "--no-messages", "--region", "us", "--database-url", url}, args...), &out); err != nil {
			t.Fatalf("assay work show: %v\n%s", err, out.String())
		}
		return out.String()
	}
	text := strings.Join(strings.Fields(show()), " ")
	for _, want := range []string{"state schema_rejected", "counts as accepted (review rv_00112233445566778899aabb amended by reviewer ana via the console)",
		"verdict amended", "resolved amended by reviewer ana via the console at", "note line moved",
		"published 1 finding(s), as the work's reviewed outcome"} {
		if !strings.Contains(text, want) {
			t.Errorf("work show lacks %q:\n%s", want, text)
		}
	}
	var s WorkStory
	if err := json.Unmarshal([]byte(show("--json")), &s); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	_ = json.Compact(&want, []byte(published))
	if s.View != store.ViewAccepted || s.Review == nil || s.Review.Resolver == nil || *s.Review.Resolver != ana || string(s.Review.Output) != want.String() {
		t.Errorf("work show --json: view %q, review %+v", s.View, s.Review)
	}
}
