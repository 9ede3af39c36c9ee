package console

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A console stream sends a snapshot only when its figures changed: the
// time it was read alone is no change, and each snapshot sent takes the
// next id.
func TestStreamSendsChangedFiguresOnly(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	cs := startConsoleStream(rec)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := &Console{Scope: "cell", Region: "us", At: at}
	if !cs.snapshot(c) {
		t.Fatal("the first snapshot was not sent")
	}
	later := *c
	later.At = at.Add(time.Minute)
	if !cs.snapshot(&later) {
		t.Fatal("the stream ended")
	}
	changed := later
	changed.Tenant = "acme"
	if !cs.snapshot(&changed) {
		t.Fatal("the stream ended")
	}
	body := rec.Body.String()
	if n := strings.Count(body, "event: snapshot\n"); n != 2 {
		t.Fatalf("%d snapshots sent, want 2 (the read time alone is no change):\n%s", n, body)
	}
	if !strings.HasPrefix(body, "id: 1\nevent: snapshot\ndata: {") || !strings.Contains(body, "\n\nid: 2\nevent: snapshot\ndata: {") ||
		!strings.Contains(body, `"tenant":"acme"`) {
		t.Fatalf("frames:\n%s", body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("headers %v", rec.Header())
	}
}
