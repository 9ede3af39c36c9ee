package committer_test

import (
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// Every ending is recorded in the end to end histogram once, whoever
// reached it: work superseded by a newer revision, dropped by admission,
// canceled, out of attempts — not only the committer's own verdicts — so
// the histogram's count by outcome is the cell's endings, the denominator
// AssayDeadlinesMissed divides by.
func TestEveryEndingIsRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	insert := func(source, revision, drop string, supersede bool) *store.Work {
		t.Helper()
		w, _, err := b.st.InsertWork(ctx, &store.Work{ID: "w_" + source + "_" + revision, TenantID: "acme", Region: "us", Contract: "moderation",
			SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: source, Revision: revision, Lane: event.Interactive,
			Input: `{"text":"hello"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute), DropReason: drop,
			SupersedeOlder: supersede},
			func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	older := insert("src-superseded", "r1", "", false)
	insert("src-superseded", "r2", "", true)
	dropped := insert("src-dropped", "r1", "over the tenant's rate; assay work rerun …", false)
	canceled := insert("src-canceled", "r1", "", false)
	exhausted := insert("src-exhausted", "r1", "", false)
	for id, state := range map[string]string{canceled.ID: outcome.Canceled, exhausted.ID: outcome.RetryExhausted} {
		if _, err := b.db.Exec(ctx, `UPDATE work SET state = $2, reason = 'the test ended it', updated_at = now() WHERE id = $1`, id, state); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{older.ID: outcome.Superseded, dropped.ID: outcome.Dropped} {
		b.waitState(t, id, want)
	}
	// The announcer runs every second; wait until it announced all four,
	// then for two passes more, which must add nothing.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM work WHERE state NOT IN ('queued', 'running') AND outcome_announced_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d endings still unannounced", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Passes, not time: the one that announced the last may still be
	// recording it when the count is read (it counts as its statement
	// returns), so four more returns leave two whole passes after it.
	for seen, deadline := b.announcer.passes.Load(), time.Now().Add(30*time.Second); b.announcer.passes.Load() < seen+4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the announcer made %d passes in 30s, want 4", b.announcer.passes.Load()-seen)
		}
	}
	counts := endToEndCounts(t, b)
	for _, o := range []string{outcome.Superseded, outcome.Dropped, outcome.Canceled, outcome.RetryExhausted} {
		if counts[o] != 1 {
			t.Errorf("assay_end_to_end_seconds_count{outcome=%q} = %v, want 1 (all: %v)", o, counts[o], counts)
		}
	}
	if len(counts) != 4 {
		t.Errorf("outcomes recorded %v, want the four endings alone", counts)
	}
}

var endToEndCount = regexp.MustCompile(`(?m)^assay_end_to_end_seconds_count\{([^}]*)\} (\S+)$`)
var outcomeLabel = regexp.MustCompile(`outcome="([a-z_]+)"`)

// endToEndCounts scrapes the committer's /metrics: the histogram's count
// by outcome.
func endToEndCounts(t *testing.T, b *bundle) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	b.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	out := map[string]float64{}
	for _, m := range endToEndCount.FindAllStringSubmatch(string(body), -1) {
		o := outcomeLabel.FindStringSubmatch(m[1])
		v, err := strconv.ParseFloat(m[2], 64)
		if o == nil || err != nil {
			t.Fatalf("cannot read %q", m[0])
		}
		out[o[1]] += v
	}
	return out
}
