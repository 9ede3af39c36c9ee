package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress/internal/desk"
	"assay.dev/services/ingress/internal/request"
)

// deskEnv is an ingress with a reviewer, ana, whose operator token is
// tok-ana.
func deskEnv(t *testing.T) *webhookEnv {
	t.Helper()
	e := newWebhookEnv(t, nil)
	if err := e.st.AddOperatorTokenAs(t.Context(), "ana", store.RoleReviewer, "tok-ana"); err != nil {
		t.Fatal(err)
	}
	return e
}

// rejectedWork stores acme's work of contract version ct with input, and
// ends it schema_rejected with no answer kept, as the gate's refusals with
// the repair budget spent do: its review item opens.
func (e *webhookEnv) rejectedWork(ct *contract.Contract, source string, input []byte) *store.Work {
	e.t.Helper()
	w := e.svc.NewWork(e.t.Context(), store.Tenant{ID: "acme"}, ct, source, "r1", "interactive", input, time.Now().Add(time.Hour))
	got, _, err := e.st.InsertWork(e.t.Context(), w, e.svc.Announcer(e.t.Context()))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.db.Exec(e.t.Context(), `UPDATE work SET state = 'schema_rejected', reason = 'schema.violation' WHERE id = $1`, got.ID); err != nil {
		e.t.Fatal(err)
	}
	return got
}

// json sends method path with token and v as its JSON body, and decodes a
// 2xx answer into out (when not nil).
func (e *webhookEnv) json(method, path, token string, v, out any) answer {
	e.t.Helper()
	body := ""
	if v != nil {
		raw, _ := json.Marshal(v)
		body = string(raw)
	}
	a := e.request(method, path, token, body)
	if out != nil && a.status/100 == 2 {
		if err := json.Unmarshal(a.body, out); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, a.body)
		}
	}
	return a
}

// grounded is a code review's finding on the first added line of d, with
// that line as its evidence.
func grounded(t *testing.T, d string) map[string]any {
	t.Helper()
	parsed, err := diff.Parse(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range parsed.Files {
		for _, h := range f.Hunks {
			for _, l := range h.Lines {
				if l.Kind == diff.Added && strings.TrimSpace(l.Text) != "" {
					return map[string]any{"file": f.Path, "line": l.NewLine, "severity": "warning", "summary": "a person's finding",
						"evidence": strings.TrimSpace(l.Text)}
				}
			}
		}
	}
	t.Fatal("the diff adds no line")
	return nil
}

// deskCase is an item of every contract version the registry holds: the
// input of its work, a whole answer a person would publish, and that
// answer with the field it names taken out.
type deskCase struct {
	input   map[string]any
	answer  map[string]any
	missing string
}

func deskCases(t *testing.T, reg *contract.Registry) map[string]deskCase {
	t.Helper()
	d := evalDiff(t, "05-checkout-state")
	finding := grounded(t, d)
	v2 := maps.Clone(finding)
	v2["category"], v2["confidence"] = "correctness", 0.8
	out := map[string]deskCase{
		"code-review/1":   {map[string]any{"diff": d}, map[string]any{"findings": []any{finding}}, "findings[0].evidence"},
		"code-review/2":   {map[string]any{"diff": d}, map[string]any{"findings": []any{v2}}, "findings[0].category"},
		"change-review/1": {map[string]any{"diff": d}, map[string]any{"severity": "medium", "tags": []any{"payments"}, "findings": []any{}}, "tags"},
		"moderation/1":    {map[string]any{"text": "a post"}, map[string]any{"category": "spam", "confidence": 0.7, "needsHumanReview": false}, "needsHumanReview"},
	}
	for _, name := range reg.Names() {
		for _, ct := range reg.Versions(name) {
			if _, ok := out[ct.SchemaVersion]; !ok {
				t.Fatalf("contract version %s has no case here: the desk must amend every version", ct.SchemaVersion)
			}
		}
	}
	return out
}

// without is answer without the field at (a name, or findings[0].name).
func without(answer map[string]any, at string) map[string]any {
	out := maps.Clone(answer)
	if name, ok := strings.CutPrefix(at, "findings[0]."); ok {
		f := maps.Clone(out["findings"].([]any)[0].(map[string]any))
		delete(f, name)
		out["findings"] = []any{f}
		return out
	}
	delete(out, at)
	return out
}

// The desk amends an answer of every version of every contract: the case
// carries that exact version's schema and the fields the cell fills in,
// an amended answer missing a field the version requires is refused with
// the field named (a code-review/2 finding's category, moderation's
// needsHumanReview), and a whole one is published once, the work's
// correlation filled in from the work.
func TestDeskAmendsEveryContractVersion(t *testing.T) {
	t.Parallel()
	e := deskEnv(t)
	reg := e.svc.D.Contracts
	cases := deskCases(t, reg)
	for version, c := range cases {
		ct, _ := reg.Version(version)
		input, _ := json.Marshal(c.input)
		w := e.rejectedWork(ct, "shop/desk#"+strings.ReplaceAll(version, "/", "-"), input)
		item := "/v1/console/reviews/rv_" + strings.TrimPrefix(w.ID, "w_")
		var kase ReviewCase
		if a := e.json("POST", item+"/claim", "tok-ana", nil, &kase); a.status != http.StatusOK {
			t.Fatalf("%s: claim: HTTP %d %s", version, a.status, a.body)
		}
		if !bytes.Equal(request.Compact(kase.Schema), request.Compact(ct.Schema)) || !slices.Equal(kase.Fixed, desk.CorrelationFields(ct)) || kase.Work.SchemaVersion != version {
			t.Errorf("%s: the case's schema is %.60s… with fixed %v; want the version's own, fixed %v", version, kase.Schema, kase.Fixed, desk.CorrelationFields(ct))
		}
		a := e.json("POST", item+"/resolve", "tok-ana", map[string]any{"verdict": "amended", "answer": without(c.answer, c.missing)}, nil)
		if a.status != http.StatusBadRequest || a.code() != "invalid_findings" || !strings.Contains(string(a.body), "fix "+c.missing) ||
			!strings.Contains(string(a.body), version) || strings.Contains(string(a.body), "amend its findings") {
			t.Errorf("%s: an answer without %s: HTTP %d %s; want 400 naming the field and the version", version, c.missing, a.status, a.body)
		}
		var done ReviewView
		if a := e.json("POST", item+"/resolve", "tok-ana", map[string]any{"verdict": "amended", "answer": c.answer}, &done); a.status != http.StatusOK ||
			!done.Published || done.Verdict != store.VerdictAmended {
			t.Fatalf("%s: the whole answer: HTTP %d %s", version, a.status, a.body)
		}
		rv, err := e.st.ReviewOfWork(t.Context(), w.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := ct.ValidateOutput(rv.Output); err != nil {
			t.Errorf("%s: the published answer %s does not fit the version: %v", version, rv.Output, err)
		}
		var doc map[string]any
		_ = json.Unmarshal(rv.Output, &doc)
		if f := ct.Correlation.WorkID; f != "" && doc[f] != w.ID {
			t.Errorf("%s: the published answer's %s is %v, want the work's id", version, f, doc[f])
		}
	}
	if n := e.count(`SELECT count(*) FROM outbox WHERE msg_id LIKE '%.reviewed'`); n != len(cases) {
		t.Errorf("%d reviewed outcomes written, want one per item (%d)", n, len(cases))
	}
	e.noErrorLogged()
}

// GET /v1/work/{id} tells the one state of work a person resolved from the
// desk: its state and outcome stay what the pipeline ended it with, view
// is accepted as GET /v1/views counts it, and review carries the verdict,
// who resolved it (the reviewer's name, as their credential said), when,
// and the answer published. The console's work page reads the same.
func TestWorkAPICarriesThePersonsResolution(t *testing.T) {
	t.Parallel()
	e := deskEnv(t)
	ct, _ := e.svc.D.Contracts.Version("code-review/2")
	c := deskCases(t, e.svc.D.Contracts)["code-review/2"]
	input, _ := json.Marshal(c.input)
	w := e.rejectedWork(ct, "shop/app#5", input)
	var before WorkView
	if a := e.json("GET", "/v1/work/"+w.ID, "tok-acme", nil, &before); a.status != http.StatusOK || before.View != "needs_review" ||
		before.Review == nil || before.Review.State != store.ReviewOpen || before.Review.SourceID != "shop/app#5" {
		t.Fatalf("before the resolution: HTTP %d %s; want view needs_review and its open item", a.status, a.body)
	}
	item := "/v1/console/reviews/rv_" + strings.TrimPrefix(w.ID, "w_")
	e.json("POST", item+"/claim", "tok-ana", nil, nil)
	if a := e.json("POST", item+"/resolve", "tok-ana", map[string]any{"verdict": "amended", "note": "fixed", "answer": c.answer}, nil); a.status != http.StatusOK {
		t.Fatalf("resolve: HTTP %d %s", a.status, a.body)
	}
	var v WorkView
	if a := e.json("GET", "/v1/work/"+w.ID, "tok-acme", nil, &v); a.status != http.StatusOK {
		t.Fatalf("GET /v1/work: HTTP %d %s", a.status, a.body)
	}
	r := v.Review
	if v.State != outcome.SchemaRejected || v.Outcome == nil || *v.Outcome != outcome.SchemaRejected || v.View != store.ViewAccepted || r == nil {
		t.Fatalf("the work after the resolution: state %s, view %s, review %+v", v.State, v.View, r)
	}
	ana := store.Actor{Kind: store.ActorReviewer, ID: "ana", Route: store.RouteConsole}
	var out struct{ Findings []map[string]any }
	if r.Verdict != store.VerdictAmended || r.ResolvedBy != "ana" || r.Resolver == nil || *r.Resolver != ana || r.ResolvedAt == nil ||
		!r.Published || r.Note != "fixed" || json.Unmarshal(r.Output, &out) != nil || len(out.Findings) != 1 || out.Findings[0]["category"] != "correctness" {
		t.Errorf("the work's review: %+v, output %s", r, r.Output)
	}
	var views ViewCounts
	e.json("GET", "/v1/views", "tok-acme", nil, &views)
	if views.States[v.View] != 1 || views.States[store.ViewNeedsReview] != 0 || views.States[store.ViewRejected] != 0 {
		t.Errorf("views %v: want the work counted %s, as the work API says", views.States, v.View)
	}
	var story WorkStory
	if a := e.json("GET", "/v1/console/work/"+w.ID, "tok-acme", nil, &story); a.status != http.StatusOK || story.View != v.View ||
		story.Review == nil || string(story.Review.Output) != string(r.Output) || story.Review.Resolution != "amended by reviewer ana via the console" {
		t.Errorf("the work page's story: HTTP %d view %s review %+v", a.status, story.View, story.Review)
	}
	e.noErrorLogged()
}

// The console's "needs review" is the review queue: accepted answers with
// a blocking finding or a high severity have no review item and count
// accepted, so the console's count, the queue's open items, /v1/views and
// the assay_work_views gauge's sample agree.
func TestConsoleNeedsReviewIsTheOpenQueue(t *testing.T) {
	t.Parallel()
	e := deskEnv(t)
	ctx := t.Context()
	reg := e.svc.D.Contracts
	for i, answer := range []string{`{"schemaVersion":1,"changeId":"%s","findings":[{"file":"a.go","line":1,"severity":"blocking","summary":"s","evidence":"e"}]}`,
		`{"schema_version":"change-review.v1","severity":"high","tags":["auth"],"findings":[]}`} {
		ct, _ := reg.Version([]string{"code-review/1", "change-review/1"}[i])
		w := e.svc.NewWork(ctx, store.Tenant{ID: "acme"}, ct, fmt.Sprintf("shop/blocking#%d", i), "r1", "batch", []byte(`{"diff":""}`), time.Now().Add(time.Hour))
		if _, _, err := e.st.InsertWork(ctx, w, e.svc.Announcer(ctx)); err != nil {
			t.Fatal(err)
		}
		token, attempt := "00000000-0000-4000-8000-00000000000"+fmt.Sprint(i), "00000000-0000-4000-8000-10000000000"+fmt.Sprint(i)
		if _, ok, err := e.st.Claim(ctx, w.ID, attempt, token, time.Minute, 0); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
		if v, err := e.st.Commit(ctx, w, attempt, token, []byte(strings.ReplaceAll(answer, "%s", w.ID)), 1, nil); err != nil || v != store.Committed {
			t.Fatalf("commit: %v %v", v, err)
		}
	}
	mod, _ := reg.Version("moderation/1")
	e.rejectedWork(mod, "post-1", []byte(`{"text":"a post"}`))
	if err := e.st.AddOperatorTokenAs(ctx, "ops", store.RoleOperator, "tok-ops"); err != nil {
		t.Fatal(err)
	}
	var queue ReviewList
	e.json("GET", "/v1/console/reviews?state=open", "tok-ops", nil, &queue)
	var console Console
	if a := e.json("GET", "/v1/console", "tok-ops", nil, &console); a.status != http.StatusOK {
		t.Fatalf("GET /v1/console: HTTP %d %s", a.status, a.body)
	}
	if console.States[store.ViewNeedsReview] != int64(len(queue.Items)) || len(queue.Items) != 1 || console.States[store.ViewAccepted] != 2 {
		t.Errorf("the console counts %v, the queue lists %d open items; want needs_review 1, the queue's, and both accepted answers accepted",
			console.States, len(queue.Items))
	}
	var views ViewCounts
	e.json("GET", "/v1/views", "tok-acme", nil, &views)
	if views.States[store.ViewNeedsReview] != int64(*views.OpenReviews) || !maps.Equal(views.States, console.States) {
		t.Errorf("/v1/views %v with %d open items; the console %v", views.States, *views.OpenReviews, console.States)
	}
	if _, err := e.svc.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	if gauge := e.svc.Views(); !maps.Equal(gauge, console.States) {
		t.Errorf("the assay_work_views sample %v, the console %v", gauge, console.States)
	}
}
