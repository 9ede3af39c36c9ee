package committer_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/committer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var names = event.Names{Cell: "us"}

type bundle struct {
	st  *store.Store
	db  *pgxpool.Pool
	js  jetstream.JetStream
	tel *telemetry.Provider
	// announcer counts the passes of setup's committer's announcer.
	announcer *countedStore
}

// countedStore is the cell's store with every AnnounceOutcomes counted once
// it returned, so that a test waits for the announcer's passes rather than
// for the time they usually take.
type countedStore struct {
	*store.Store
	passes atomic.Int64
}

func (c *countedStore) AnnounceOutcomes(ctx context.Context, limit int, announce store.Announce) (int, error) {
	defer c.passes.Add(1)
	return c.Store.AnnounceOutcomes(ctx, limit, announce)
}

// setup starts the committer alone on real Postgres and JetStream; what the
// classifier would do (the streams, the claim, the event) the test
// does itself.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := setupCell(t)
	ctx := t.Context()
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetrytest.Provider(t, "committer", "us")
	b.announcer = &countedStore{Store: b.st}
	svc, err := committer.New(committer.Config{Region: "us"}, committer.Deps{Store: b.announcer, JS: b.js, Contracts: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })
	for _, kind := range []string{event.KindAttempt, event.KindResult} {
		if _, err := event.EnsureStream(ctx, b.js, nil, names, kind, event.StreamSettings{}); err != nil {
			t.Fatal(err)
		}
	}
	b.tel = tel
	return b
}

// setupCell is the cell's database and JetStream with no committer
// running: a test that runs its own passes needs no other reaper beside.
func setupCell(t *testing.T) *bundle {
	t.Helper()
	st, url := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{st: st, db: testenv.Pool(t, url), js: js}
}

// claimed stores moderation work and claims it, as a classifier would
// before its call; it returns the result an answer would travel in.
func (b *bundle) claimed(t *testing.T, source string) event.Result {
	t.Helper()
	ctx := t.Context()
	w, _, err := b.st.InsertWork(ctx, &store.Work{ID: "w_" + source, TenantID: "acme", Region: "us", Contract: "moderation",
		SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: source, Revision: "r1", Lane: event.Interactive,
		Input: `{"text":"hello"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)},
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	attempt := "00000000-0000-4000-8000-" + source[len(source)-12:]
	token := "00000000-0000-4000-9000-" + source[len(source)-12:]
	if _, ok, err := b.st.Claim(ctx, w.ID, attempt, token, time.Minute, 0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	return event.Result{AttemptID: attempt, WorkID: w.ID, TenantID: "acme", Region: "us", Number: 1, LeaseToken: token,
		Contract: "moderation", SchemaVersion: w.SchemaVersion, TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest,
		Outcome: outcome.AttemptOK, Final: true}
}

// answered records the attempt's answer in the cell, as the classifier
// does in the transaction that hands it over.
func (b *bundle) answered(t *testing.T, ev event.Result, answer string) {
	t.Helper()
	if _, err := b.st.RecordAttempt(t.Context(), store.AttemptRecord{AttemptID: ev.AttemptID, WorkID: ev.WorkID,
		LeaseToken: ev.LeaseToken, Outcome: ev.Outcome, Raw: []byte(answer), Change: store.Handoff, HandoffTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// publish publishes the ATTEMPT event of a call that came to ev.
func (b *bundle) publish(t *testing.T, ev event.Result) {
	t.Helper()
	if _, err := b.js.Publish(t.Context(), names.Attempt(ev.TenantID), attemptOf(ev)); err != nil {
		t.Fatal(err)
	}
}

// attemptOf is the payload of the ATTEMPT event of a call that came to ev.
func attemptOf(ev event.Result) []byte {
	raw, _ := json.Marshal(event.Attempt{AttemptID: ev.AttemptID, WorkID: ev.WorkID, TenantID: ev.TenantID, Region: ev.Region,
		Number: ev.Number, Model: "gpt-4o-mini", Outcome: ev.Outcome, UpstreamAttempts: 1, InputUnits: 10, OutputUnits: 5,
		At: time.Now().UTC(), Result: &ev})
	return raw
}

// publishEarlier publishes ev on its own on RESULT, as a classifier of an
// earlier release did.
func (b *bundle) publishEarlier(t *testing.T, ev event.Result) {
	t.Helper()
	raw, _ := json.Marshal(ev)
	if _, err := b.js.Publish(t.Context(), names.Result(ev.TenantID), raw); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) waitState(t *testing.T, id, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var state string
		if err := b.db.QueryRow(t.Context(), `SELECT state FROM work WHERE id = $1`, id).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("work %s is %s, want %s", id, state, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The committer on its own: a valid answer becomes the one result, an
// invalid one ends the work schema_rejected, a second answer and a
// redelivery change nothing. Results come in ATTEMPT events, or on their
// own on RESULT from a classifier of an earlier release; an ATTEMPT event
// without a result (a call that is one part of a review) is not the
// committer's.
func TestCommitterAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	part := b.claimed(t, "post-000000000004")
	partCall := event.Attempt{AttemptID: "00000000-0000-4000-8000-0000000000ee", WorkID: part.WorkID, TenantID: "acme",
		Region: "us", Number: 1, Model: "gpt-4o-mini", Outcome: outcome.AttemptOK, UpstreamAttempts: 1, At: time.Now().UTC()}
	raw, _ := json.Marshal(partCall)
	if _, err := b.js.Publish(t.Context(), names.Attempt("acme"), raw); err != nil {
		t.Fatal(err)
	}
	good := b.claimed(t, "post-000000000001")
	b.answered(t, good, `{"category":"spam","confidence":0.9,"needsHumanReview":false}`)
	b.publish(t, good)
	b.publishEarlier(t, good) // redelivered, the way an earlier release sent it
	b.waitState(t, good.WorkID, outcome.Accepted)

	bad := b.claimed(t, "post-000000000002")
	b.answered(t, bad, `{"category":"ads","confidence":0.9,"needsHumanReview":false}`)
	b.publish(t, bad)
	b.waitState(t, bad.WorkID, outcome.SchemaRejected)

	stray := good
	stray.AttemptID = "00000000-0000-4000-8000-0000000000ff"
	if _, err := b.db.Exec(t.Context(), `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token)
		VALUES ($1, $2, 'acme', 2, gen_random_uuid())`, stray.AttemptID, stray.WorkID); err != nil {
		t.Fatal(err)
	}
	b.publish(t, stray)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var o *string
		if err := b.db.QueryRow(t.Context(), `SELECT outcome FROM attempts WHERE id = $1`, stray.AttemptID).Scan(&o); err != nil {
			t.Fatal(err)
		}
		if o != nil && *o == outcome.AttemptStaleLease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second answer is %v, want stale_lease", o)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var results int
	if err := b.db.QueryRow(t.Context(), `SELECT count(*) FROM results`).Scan(&results); err != nil {
		t.Fatal(err)
	}
	if results != 1 {
		t.Fatalf("result rows = %d, want 1", results)
	}
	if w, err := b.st.GetWork(t.Context(), part.WorkID); err != nil || w.State != outcome.Running {
		t.Fatalf("work with a part's call only: %+v %v; want it left running", w, err)
	}
	consumed := func(kind string) bool {
		c, err := b.js.Consumer(t.Context(), names.Stream(kind), committer.Consumer(names))
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}
	deadline = time.Now().Add(15 * time.Second)
	for !consumed(event.KindAttempt) || !consumed(event.KindResult) {
		if time.Now().After(deadline) {
			t.Fatal("the committer's consumers on ATTEMPT and RESULT did not take every message within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A result the broker acknowledged and then lost is read back: in an
// ATTEMPT event kept on its attempt's row, in one from the outbox, or on
// its own in a RESULT event of an earlier release: its answer gets its
// verdict without waiting out the handoff lease and paying for another
// call.
func TestReaperCommitsLostResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := b.claimed(t, "post-000000000003")
	earlier := b.claimed(t, "post-000000000005")
	onRow := b.claimed(t, "post-000000000007")
	earlierPayload, _ := json.Marshal(earlier)
	for _, m := range []struct {
		ev     event.Result
		outbox store.OutboxMsg
	}{
		{ev, store.OutboxMsg{Stream: event.KindAttempt, Subject: names.Attempt("acme"), MsgID: ev.AttemptID, Payload: attemptOf(ev)}},
		{earlier, store.OutboxMsg{Stream: event.KindResult, Subject: names.Result("acme"), MsgID: earlier.AttemptID, Payload: earlierPayload}},
		{onRow, store.OutboxMsg{Stream: event.KindAttempt, Subject: names.Attempt("acme"), MsgID: onRow.AttemptID, Payload: attemptOf(onRow),
			NoRow: true}},
	} {
		if _, err := b.st.RecordAttempt(t.Context(), store.AttemptRecord{AttemptID: m.ev.AttemptID, WorkID: m.ev.WorkID,
			LeaseToken: m.ev.LeaseToken, Outcome: m.ev.Outcome, Raw: []byte(`{"category":"other","confidence":0.5,"needsHumanReview":false}`),
			Change: store.Handoff, HandoffTTL: 5 * time.Minute, Outbox: []store.OutboxMsg{m.outbox}}); err != nil {
			t.Fatal(err)
		}
	}
	// Published two minutes ago, never delivered: the broker lost it.
	if _, err := b.db.Exec(t.Context(), `UPDATE outbox SET published_at = now() - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(t.Context(), `UPDATE attempts SET finished_at = now() - interval '2 minutes' WHERE id = $1`,
		onRow.AttemptID); err != nil {
		t.Fatal(err)
	}
	reg, _ := contract.Load()
	tel := telemetrytest.Provider(t, "committer", "us")
	svc, err := committer.New(committer.Config{Region: "us", ReapEvery: -1, ReapGrace: time.Second},
		committer.Deps{Store: b.st, JS: b.js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := svc.Reap(t.Context()); err != nil || n != 3 {
		t.Fatalf("reap: %d %v, want 3 events read back", n, err)
	}
	b.waitState(t, ev.WorkID, outcome.Accepted)
	b.waitState(t, earlier.WorkID, outcome.Accepted)
	b.waitState(t, onRow.WorkID, outcome.Accepted)
	if n, err := svc.Reap(t.Context()); err != nil || n != 0 {
		t.Fatalf("second reap: %d %v, want nothing left", n, err)
	}
}
