package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// assay work show prints the work's review item and every act on it with
// who did it, of which kind and through which route.
func TestPrintStorySaysWhoActed(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	resolved := at.Add(time.Minute)
	s := &WorkStory{WorkStory: &ingress.WorkStory{
		Work: ingress.WorkRow{ID: "w_0123456789abcdef01234567", State: "schema_rejected"},
		Actions: []store.WorkAction{
			{Action: store.ActionClaim, By: "dev", Kind: store.ActorReviewer, Route: store.RouteConsole, At: at},
			{Action: store.ActionResolve, By: "acme", Kind: store.ActorTenant, Route: store.RouteAPI, Note: "dismissed", At: resolved},
		},
		Review: &ingress.ReviewView{ReviewID: "rv_0123456789abcdef01234567", Reason: "schema_rejected", State: "resolved",
			Resolution: "dismissed by tenant acme via the API", ResolvedAt: &resolved},
	}}
	var out bytes.Buffer
	if err := printStory(&out, s); err != nil {
		t.Fatal(err)
	}
	// The columns' widths aside, these lines are printed.
	text := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"review rv_0123456789abcdef01234567 schema_rejected dismissed by tenant acme via the API",
		"2026-03-01T12:00:00Z claim by reviewer dev via the console", "2026-03-01T12:01:00Z resolve by tenant acme via the API dismissed"} {
		if !strings.Contains(text, want) {
			t.Errorf("work show lacks %q:\n%s", want, out.String())
		}
	}
}
