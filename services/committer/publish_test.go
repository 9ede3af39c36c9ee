package committer_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/committer"
)

// The commit's accepted outcome is published once the commit has
// committed, with no outbox row (the work row says it); an outcome reached elsewhere (a dropped webhook) is
// announced by the sweep; with no GitHub App the publisher records what it
// would publish.
func TestOutcomesReachThePublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	// A service of its own installation, so no other test's publisher
	// takes its outcomes.
	own := event.Names{Installation: "pubsvc", Cell: "us"}
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", Names: own, AnnounceEvery: 50 * time.Millisecond},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.EnsureStream(ctx, b.js, nil, own, event.KindResult, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })

	good := b.claimed(t, "post-000000000041")
	b.answered(t, good, `{"category":"spam","confidence":0.9,"needsHumanReview":false}`)
	if err := svc.Commit(ctx, good); err != nil {
		t.Fatal(err)
	}
	waitRow(t, "the accepted outcome published", func() bool {
		st, err := b.js.Stream(ctx, own.Stream(event.KindOutcome))
		if err != nil {
			return false
		}
		m, err := st.GetLastMsgForSubject(ctx, own.Outcome("acme"))
		return err == nil && m.Header.Get(jetstream.MsgIDHeader) == event.OutcomeMsgID(good.WorkID, outcome.Accepted)
	})
	var rows int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE msg_id = $1`,
		event.OutcomeMsgID(good.WorkID, outcome.Accepted)).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows of the commit's outcome (%v), want none", rows, err)
	}

	dropped := &store.Work{ID: "w_dropped41", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "2026-11", SourceID: "shop/app#41", Revision: strings.Repeat("a", 40), Lane: event.Interactive,
		Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute),
		DropReason: "over acme's interactive rate when this arrived; ask again with: assay work rerun w_dropped41 --region us"}
	if _, err := b.st.InsertWebhookWork(ctx, store.Delivery{ID: "d41", TenantID: "acme", Event: "pull_request", Action: "opened",
		Installation: 7}, dropped, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	var pub *store.Publication
	waitRow(t, "the dropped work's dry publication", func() bool {
		pub, err = b.st.GetPublication(ctx, dropped.ID, "dry")
		return err == nil && !pub.PublishedAt.IsZero()
	})
	var plan struct {
		Rerun    string          `json:"rerun"`
		CheckRun json.RawMessage `json:"checkRun"`
	}
	if err := json.Unmarshal(pub.Plan, &plan); err != nil || !strings.Contains(plan.Rerun, "assay work rerun w_dropped41 --region us") || plan.CheckRun != nil {
		t.Fatalf("dry plan %s: want the rerun comment and no check run", pub.Plan)
	}
}

func waitRow(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An OUTCOME event the broker acknowledged and lost is read back by the
// reaper and published: from its outbox row, or, for an event that has
// none (a commit's), rebuilt from the work row.
func TestReaperPublishesLostOutcomes(t *testing.T) {
	t.Parallel()
	b := setupCell(t)
	ctx := t.Context()
	expired := func(id, pr string) *store.Work {
		w := &store.Work{ID: id, TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
			TaxonomyVersion: "2026-11", SourceID: "shop/app#" + pr, Revision: strings.Repeat("c", 40), Lane: event.Interactive,
			Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)}
		if _, _, err := b.st.InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.st.FinishUnleased(ctx, w.ID, outcome.Expired, "deadline passed"); err != nil || !ok {
			t.Fatalf("expire: %v %v", ok, err)
		}
		return w
	}
	w, rowless := expired("w_lost51", "51"), expired("w_lost52", "52")
	// Announced two minutes ago with no outbox row; the broker lost it.
	if _, err := b.db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() - interval '2 minutes' WHERE id = $1`,
		rowless.ID); err != nil {
		t.Fatal(err)
	}
	id := event.OutcomeMsgID(w.ID, outcome.Expired)
	payload, _ := json.Marshal(event.Outcome{OutcomeID: id, WorkID: w.ID, TenantID: "acme", Region: "us", Outcome: outcome.Expired})
	// Announced and published two minutes ago; the broker lost it.
	if _, err := b.db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers, published_at)
		VALUES ('OUTCOME', 'nowhere.outcome.acme', $1, $2, '{}', now() - interval '2 minutes')`, id, payload); err != nil {
		t.Fatal(err)
	}
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", Names: event.Names{Installation: "reaped", Cell: "us"},
		ReapEvery: -1, AnnounceEvery: -1, ReapGrace: time.Second},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*store.Work{w, rowless} {
		pub, err := b.st.GetPublication(ctx, w.ID, "dry")
		if err != nil || pub.PublishedAt.IsZero() || !strings.Contains(string(pub.Plan), `"timed_out"`) {
			t.Fatalf("%s after the reap: %+v, %v; want the expired check run recorded", w.ID, pub, err)
		}
	}
	if n, err := svc.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("second reap: %d, %v; want nothing left", n, err)
	}
}

// 300 outcomes with nothing to publish (code reviews of pull requests no
// installation of their tenant covers) and one lost outcome among them
// whose pull request is covered, all published to the broker and never
// delivered: one pass of the reaper reads each once — the 300 are marked
// skipped with their reason, the lost one is published to GitHub — and the
// next pass reads nothing.
func TestReaperReadsNothingToPublishOnce(t *testing.T) {
	t.Parallel()
	b := setupCell(t)
	ctx := t.Context()
	const quiet = 300
	// Expired code reviews of shop/other#1…#300, announced and published
	// to the broker two minutes ago.
	if _, err := b.db.Exec(ctx, `WITH w AS (
			INSERT INTO work (id, tenant_id, region, contract, schema_version, taxonomy_version, source_id, revision, lane,
				input, content_digest, state, reason, deadline_at, outcome_announced_at)
			SELECT 'w_quiet' || n, 'acme', 'us', 'code-review', '1', '2026-11', 'shop/other#' || n, repeat('d', 40), 'interactive',
				'{}', 'sha256:00', 'expired', 'deadline passed', now() - interval '3 minutes', now() - interval '2 minutes'
			FROM generate_series(1, $1) n RETURNING id)
		INSERT INTO outbox (stream, subject, msg_id, payload, headers, published_at)
		SELECT 'OUTCOME', 'nowhere.outcome.acme', id || '.expired',
			json_build_object('outcomeId', id || '.expired', 'workId', id, 'tenantId', 'acme', 'region', 'us', 'outcome', 'expired')::text::bytea,
			'{}', now() - interval '2 minutes'
		FROM w`, quiet); err != nil {
		t.Fatal(err)
	}
	// The lost one: shop/lost#1, which installation 42 of acme covers.
	if err := b.st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "42", Tenant: "acme",
		Repositories: []string{"shop/lost"}}); err != nil {
		t.Fatal(err)
	}
	lost := &store.Work{ID: "w_lost61", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "2026-11", SourceID: "shop/lost#1", Revision: strings.Repeat("e", 40), Lane: event.Interactive,
		Input: `{}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)}
	if _, _, err := b.st.InsertWork(ctx, lost, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.st.FinishUnleased(ctx, lost.ID, outcome.Expired, "deadline passed"); err != nil || !ok {
		t.Fatalf("expire: %v %v", ok, err)
	}
	id := event.OutcomeMsgID(lost.ID, outcome.Expired)
	payload, _ := json.Marshal(event.Outcome{OutcomeID: id, WorkID: lost.ID, TenantID: "acme", Region: "us", Outcome: outcome.Expired})
	if _, err := b.db.Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, lost.ID); err != nil {
		t.Fatal(err)
	}
	// Published a minute after the first of the quiet ones: the reader's
	// order puts it past the first batch.
	if _, err := b.db.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers, published_at)
		VALUES ('OUTCOME', 'nowhere.outcome.acme', $1, $2, '{}', now() - interval '90 seconds')`, id, payload); err != nil {
		t.Fatal(err)
	}

	gh := fakegithub.New()
	t.Cleanup(gh.Close)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gh.App(5, &key.PublicKey)
	log := &testenv.DecisionLog{}
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", Names: event.Names{Installation: "quiet", Cell: "us"},
		ReapEvery: -1, AnnounceEvery: -1, ReapGrace: time.Second, GitHubAPI: gh.URL, GitHubAppID: 5, GitHubKey: key},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewJSONHandler(log, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	n, err := svc.Reap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reaped := reads(t, log)
	if len(reaped) != quiet+1 || n != quiet+1 {
		t.Fatalf("one pass read %d outcomes (%d distinct), want %d", n, len(reaped), quiet+1)
	}
	for k, c := range reaped {
		if c != 1 {
			t.Errorf("%s read %d times in the pass, want once", k, c)
		}
	}
	if runs := gh.CheckRuns(); len(runs) != 1 || runs[0].ExternalID != lost.ID || runs[0].Conclusion != "timed_out" {
		t.Fatalf("check runs after the pass: %+v; want the lost outcome's timed_out run", runs)
	}
	if n := count(t, b, `SELECT count(*) FROM publications WHERE target = 'none' AND state = 'skipped'
		AND reason = 'no GitHub App installation of the tenant covers shop/other'`); n != quiet {
		t.Fatalf("%d outcomes marked skipped with their reason, want %d", n, quiet)
	}
	if n, err := svc.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("second pass: %d read, %v; want none", n, err)
	}
	for k, c := range reads(t, log) {
		if c != 1 {
			t.Errorf("%s read %d times over two passes, want once", k, c)
		}
	}
	t.Logf("%d nothing-to-publish outcomes and 1 lost: one pass read each once (%d reads), published the lost one; the second pass read 0",
		quiet, n)
}

// reads counts the "reaped" decisions of each key: how often the reaper
// read the outcome back.
func reads(t *testing.T, log *testenv.DecisionLog) map[string]int {
	out := map[string]int{}
	for _, d := range log.Decisions(t) {
		if d.Outcome == "reaped" {
			out[d.Key]++
		}
	}
	return out
}

func count(t *testing.T, b *bundle, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
