package committer_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/committer"
)

// passTime moves everything the cell dated, its outcome mark included,
// back by d, as if d had passed since: every outbox row was sent when it
// was written.
func passTime(t *testing.T, b *bundle, d time.Duration) {
	t.Helper()
	for _, q := range []string{
		`UPDATE outcome_mark SET at = at - $1 * interval '1 microsecond'`,
		`UPDATE work SET created_at = created_at - $1 * interval '1 microsecond', updated_at = updated_at - $1 * interval '1 microsecond',
			deadline_at = deadline_at - $1 * interval '1 microsecond',
			outcome_announced_at = outcome_announced_at - $1 * interval '1 microsecond'`,
		`UPDATE outbox SET created_at = created_at - $1 * interval '1 microsecond',
			published_at = coalesce(published_at, created_at) - $1 * interval '1 microsecond'`,
		`DELETE FROM outbox_waiting q USING outbox o WHERE o.id = q.id AND o.published_at < now() - $1 * interval '1 microsecond'`,
	} {
		if _, err := b.db.Exec(t.Context(), q, d.Microseconds()); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// The committer was down for 25 hours, and the broker had lost the two
// outcomes announced just before: a commit's, which only its work row
// says, and one with an OUTCOME outbox row. Back up, its reaper's first
// pass reads both back from the outcome mark its last pass left and
// publishes them: each to the tenant's callback, and the pull request's
// also to the dry record. Each publication's deadline starts at that first
// try, so none is failed for the day that passed; the next pass reads
// nothing and the mark is at now.
func TestReaperPublishesWhatItOwedAfterAnOutage(t *testing.T) {
	t.Parallel()
	b := setupCell(t)
	ctx := t.Context()
	var mu sync.Mutex
	delivered := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Data struct {
				WorkID string `json:"workId"`
			} `json:"data"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		delivered[body.Data.WorkID]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	if err := b.st.SetCallback(ctx, "acme", store.Callback{URL: srv.URL, Secret: store.NewCallbackSecret()}); err != nil {
		t.Fatal(err)
	}
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", Names: event.Names{Installation: "outage", Cell: "us"},
		ReapEvery: -1, AnnounceEvery: -1, ReapGrace: time.Second},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	// Its last pass before the outage: nothing was owed.
	if n, err := svc.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("pass before the outage: %d, %v; want nothing", n, err)
	}

	ended := func(id, contract, source string) *store.Work {
		w := &store.Work{ID: id, TenantID: "acme", Region: "us", Contract: contract, SchemaVersion: "1",
			TaxonomyVersion: "2026-11", SourceID: source, Revision: strings.Repeat("f", 40), Lane: event.Interactive,
			Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)}
		if _, _, err := b.st.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.st.FinishUnleased(ctx, w.ID, outcome.Expired, "deadline passed"); err != nil || !ok {
			t.Fatalf("expire: %v %v", ok, err)
		}
		if _, err := b.db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
			t.Fatal(err)
		}
		return w
	}
	// A commit's outcome: the work row says it, and no event reached the
	// publisher.
	rowless := ended("w_outage71", "moderation", "post-000000000071")
	// An outcome announced with an OUTCOME row, sent, and lost.
	rowed := ended("w_outage72", "code-review", "shop/app#72")
	id := event.OutcomeMsgID(rowed.ID, outcome.Expired)
	payload, _ := json.Marshal(event.Outcome{OutcomeID: id, WorkID: rowed.ID, TenantID: "acme", Region: "us", Outcome: outcome.Expired})
	if _, err := b.db.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers, published_at)
		VALUES ('OUTCOME', 'outage.outcome.acme', $1, $2, '{}', now())`, id, payload); err != nil {
		t.Fatal(err)
	}
	passTime(t, b, 25*time.Hour)

	if n, err := svc.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("first pass after the outage: %d read, %v; want the 2 outcomes owed", n, err)
	}
	var dbNow time.Time
	if err := b.db.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*store.Work{rowless, rowed} {
		var pub *store.Publication
		waitRow(t, w.ID+"'s callback made", func() bool {
			pub, err = b.st.GetPublication(ctx, w.ID, "callback")
			return err == nil && pub.State != store.PublicationPending
		})
		if pub.State != "published" || pub.Outcome != outcome.Expired || pub.DeadlineAt.Before(dbNow.Add(23*time.Hour)) {
			t.Fatalf("%s's callback: %s %s, deadline %s; want published, with a deadline a day from its first try",
				w.ID, pub.State, pub.Outcome, pub.DeadlineAt)
		}
	}
	if pub, err := b.st.GetPublication(ctx, rowed.ID, "dry"); err != nil || pub.PublishedAt.IsZero() {
		t.Fatalf("the pull request's dry record: %+v, %v; want it made", pub, err)
	}
	mu.Lock()
	if delivered[rowless.ID] != 1 || delivered[rowed.ID] != 1 {
		t.Errorf("callbacks delivered %v, want one for each outcome", delivered)
	}
	mu.Unlock()
	if n := count(t, b, `SELECT count(*) FROM publications WHERE state = 'failed'`); n != 0 {
		t.Fatalf("%d publications failed, want none", n)
	}

	if n, err := svc.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("second pass: %d read, %v; want nothing left", n, err)
	}
	var behind time.Duration
	if err := b.db.QueryRow(ctx, `SELECT now() - at FROM outcome_mark`).Scan(&behind); err != nil {
		t.Fatal(err)
	}
	if behind > time.Minute {
		t.Fatalf("the outcome mark is %s behind once nothing is owed, want it at now", behind)
	}
}

// An outcome a day old whose publication the publisher already recorded
// is not read back: the reaper publishes nothing again.
func TestReaperLeavesPublishedOutcomes(t *testing.T) {
	t.Parallel()
	b := setupCell(t)
	ctx := t.Context()
	w := &store.Work{ID: "w_outage81", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "2026-11", SourceID: "shop/app#81", Revision: strings.Repeat("f", 40), Lane: event.Interactive,
		Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)}
	if _, _, err := b.st.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.st.FinishUnleased(ctx, w.ID, outcome.Expired, "deadline passed"); err != nil || !ok {
		t.Fatalf("expire: %v %v", ok, err)
	}
	if _, err := b.db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.st.RecordDryPublication(ctx, w.ID, "acme", outcome.Expired, json.RawMessage(`{"recorded":"before"}`)); err != nil {
		t.Fatal(err)
	}
	passTime(t, b, 25*time.Hour)
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", Names: event.Names{Installation: "published", Cell: "us"},
		ReapEvery: -1, AnnounceEvery: -1, ReapGrace: time.Second},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := svc.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("pass: %d read, %v; want nothing: the outcome has its publication", n, err)
	}
	if pub, err := b.st.GetPublication(ctx, w.ID, "dry"); err != nil || string(pub.Plan) != `{"recorded": "before"}` {
		t.Fatalf("the dry record: %+v, %v; want the one made before, untouched", pub, err)
	}
}
