package store_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup opens a fresh, migrated database with the tenants acme and other.
func setup(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	ctx := t.Context()
	s := open(t, testenv.Database(t))
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	err := s.SeedTenants(ctx, []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: "tok-acme"},
		{ID: "other", HomeRegion: "us", Token: "tok-other"},
	})
	if err != nil {
		t.Fatalf("seed tenants: %v", err)
	}
	return s, ctx
}

func open(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func newWork(tenant, source, revision string) *store.Work {
	return &store.Work{
		ID:              "w_" + tenant + "_" + source + "_" + revision,
		TenantID:        tenant,
		Region:          "us",
		Contract:        "pr-review",
		SchemaVersion:   "1",
		TaxonomyVersion: "1",
		SourceID:        source,
		Revision:        revision,
		Lane:            "batch",
		Input:           `{"diff":""}`,
		Digest:          "sha256:00",
		DeadlineAt:      time.Now().Add(time.Hour),
	}
}

func announce(w *store.Work) ([]store.OutboxMsg, error) {
	return []store.OutboxMsg{{
		Stream:  "WORK",
		Subject: "assay.us.work.batch." + w.TenantID,
		MsgID:   fmt.Sprintf("%s.%d", w.ID, w.Dispatch),
		Payload: []byte(`{"workId":"` + w.ID + `"}`),
	}}, nil
}

func insert(t *testing.T, ctx context.Context, s *store.Store, w *store.Work) *store.Work {
	t.Helper()
	got, created, err := s.InsertWork(ctx, w, announce)
	if err != nil {
		t.Fatalf("insert work: %v", err)
	}
	if !created {
		t.Fatalf("insert work %s: created=false for a new key", w.ID)
	}
	return got
}

func claim(t *testing.T, ctx context.Context, s *store.Store, workID, attemptID, token string, ttl time.Duration) *store.Work {
	t.Helper()
	w, ok, err := s.Claim(ctx, workID, attemptID, token, ttl, 0)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if !ok {
		t.Fatalf("claim %s with %s: not ok", workID, token)
	}
	return w
}

// waitLeaseExpired polls until the database's clock has passed the work's
// lease.
func waitLeaseExpired(t *testing.T, ctx context.Context, s *store.Store, workID string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var expired bool
		if err := store.Pool(s).QueryRow(ctx, `SELECT lease_expires_at < now() FROM work WHERE id = $1`, workID).Scan(&expired); err != nil {
			t.Fatalf("read lease: %v", err)
		}
		if expired {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease of %s did not expire within 30s", workID)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func count(t *testing.T, ctx context.Context, s *store.Store, query string, args ...any) int {
	t.Helper()
	var n int
	if err := store.Pool(s).QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func attemptOutcome(t *testing.T, ctx context.Context, s *store.Store, attemptID string) string {
	t.Helper()
	var outcome string
	err := store.Pool(s).QueryRow(ctx, `SELECT coalesce(outcome, '') FROM attempts WHERE id = $1`, attemptID).Scan(&outcome)
	if err != nil {
		t.Fatalf("read attempt %s: %v", attemptID, err)
	}
	return outcome
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := open(t, testenv.Database(t))
	first, err := s.Migrate(ctx)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if !slices.Equal(first, store.Versions()) || len(first) == 0 {
		t.Fatalf("first migrate applied %v, want %v", first, store.Versions())
	}
	second, err := s.Migrate(ctx)
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if len(second) != 0 {
		t.Fatalf("second migrate applied %v, want nothing", second)
	}
}

func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testenv.Database(t)
	stores := make([]*store.Store, 4)
	for i := range stores {
		stores[i] = open(t, url)
	}
	applied := make([][]string, len(stores))
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() { applied[i], errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	var total []string
	for i := range stores {
		if errs[i] != nil {
			t.Fatalf("migrate %d: %v", i, errs[i])
		}
		total = append(total, applied[i]...)
	}
	slices.Sort(total)
	if !slices.Equal(total, store.Versions()) {
		t.Fatalf("migrations applied across callers = %v, want each of %v exactly once", total, store.Versions())
	}
	if n := count(t, ctx, stores[0], `SELECT count(*) FROM schema_migrations`); n != len(store.Versions()) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, len(store.Versions()))
	}
}

func TestInsertWorkFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	const n = 20
	type res struct {
		id      string
		created bool
		err     error
	}
	results := make([]res, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			w := newWork("acme", "octo/repo#1", "abc")
			got, created, err := s.InsertWork(ctx, w, announce)
			if err == nil {
				results[i] = res{id: got.ID, created: created}
			} else {
				results[i] = res{err: err}
			}
		})
	}
	wg.Wait()
	createdCount := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("insert %d: %v", i, r.err)
		}
		if r.id != results[0].id {
			t.Fatalf("insert %d returned id %q, insert 0 returned %q", i, r.id, results[0].id)
		}
		if r.created {
			createdCount++
		}
	}
	if createdCount != 1 {
		t.Fatalf("%d inserts reported created, want exactly 1", createdCount)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM work`); got != 1 {
		t.Fatalf("%d work rows, want 1", got)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM outbox`); got != 1 {
		t.Fatalf("%d outbox rows, want 1", got)
	}

	next, created, err := s.InsertWork(ctx, newWork("acme", "octo/repo#1", "def"), announce)
	if err != nil {
		t.Fatalf("insert new revision: %v", err)
	}
	if !created || next.ID == results[0].id {
		t.Fatalf("new revision: created=%v id=%q, want a second work row", created, next.ID)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM work`); got != 2 {
		t.Fatalf("%d work rows after a new revision, want 2", got)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM outbox`); got != 2 {
		t.Fatalf("%d outbox rows after a new revision, want 2", got)
	}
}

func TestInsertWorkAnnounceErrorRollsBack(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	boom := errors.New("boom")
	_, _, err := s.InsertWork(ctx, newWork("acme", "octo/repo#2", "abc"), func(*store.Work) ([]store.OutboxMsg, error) {
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InsertWork error = %v, want the announce error", err)
	}
	if got := count(t, ctx, s, `SELECT count(*) FROM work`); got != 0 {
		t.Fatalf("%d work rows after a failed announce, want 0", got)
	}
}

func TestClaimFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#3", "abc"))

	tokens := []string{newUUID(), newUUID()}
	oks := make([]bool, len(tokens))
	errs := make([]error, len(tokens))
	var wg sync.WaitGroup
	for i, tok := range tokens {
		wg.Go(func() { _, oks[i], errs[i] = s.Claim(ctx, w.ID, newUUID(), tok, time.Minute, 0) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
	if oks[0] == oks[1] {
		t.Fatalf("concurrent claims ok = %v, want exactly one", oks)
	}
	winner := tokens[0]
	if oks[1] {
		winner = tokens[1]
	}
	got, err := s.GetWork(ctx, w.ID)
	if err != nil {
		t.Fatalf("get work: %v", err)
	}
	if got.State != "running" || got.LeaseToken != winner || got.Attempts != 1 {
		t.Fatalf("after claim: state=%s token=%s attempts=%d, want running %s 1", got.State, got.LeaseToken, got.Attempts, winner)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE work_id = $1`, w.ID); n != 1 {
		t.Fatalf("%d attempt rows, want 1", n)
	}

	if _, ok, err := s.Claim(ctx, w.ID, newUUID(), newUUID(), time.Minute, 0); err != nil || ok {
		t.Fatalf("claim on a live lease: ok=%v err=%v, want not ok", ok, err)
	}
	if _, ok, err := s.Claim(ctx, "w_missing", newUUID(), newUUID(), time.Minute, 0); err != nil || ok {
		t.Fatalf("claim on missing work: ok=%v err=%v, want not ok", ok, err)
	}
}

func TestClaimAfterLeaseExpires(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#4", "abc"))
	oldToken, newToken := newUUID(), newUUID()
	claim(t, ctx, s, w.ID, newUUID(), oldToken, 50*time.Millisecond)
	waitLeaseExpired(t, ctx, s, w.ID)

	got := claim(t, ctx, s, w.ID, newUUID(), newToken, time.Minute)
	if got.Attempts != 2 || got.LeaseToken != newToken {
		t.Fatalf("second claim: attempts=%d token=%s, want 2 %s", got.Attempts, got.LeaseToken, newToken)
	}
	if ok, err := s.ExtendLease(ctx, w.ID, oldToken, time.Minute); err != nil || ok {
		t.Fatalf("extend with the old token: ok=%v err=%v, want false", ok, err)
	}
	if ok, err := store.FinishLeased(ctx, s, w.ID, oldToken, "accepted", ""); err != nil || ok {
		t.Fatalf("finish with the old token: ok=%v err=%v, want false", ok, err)
	}
	if ok, err := s.ExtendLease(ctx, w.ID, newToken, time.Minute); err != nil || !ok {
		t.Fatalf("extend with the live token: ok=%v err=%v, want true", ok, err)
	}
	cur, err := s.GetWork(ctx, w.ID)
	if err != nil {
		t.Fatalf("get work: %v", err)
	}
	if cur.State != "running" || cur.LeaseToken != newToken {
		t.Fatalf("work state=%s token=%s, want running %s", cur.State, cur.LeaseToken, newToken)
	}
	numbers := count(t, ctx, s, `SELECT count(DISTINCT number) FROM attempts WHERE work_id = $1`, w.ID)
	if numbers != 2 {
		t.Fatalf("%d distinct attempt numbers, want 2", numbers)
	}
}

func TestCommitFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#5", "abc"))
	oldAttempt, oldToken := newUUID(), newUUID()
	claim(t, ctx, s, w.ID, oldAttempt, oldToken, 50*time.Millisecond)
	waitLeaseExpired(t, ctx, s, w.ID)
	liveAttempt, liveToken := newUUID(), newUUID()
	w = claim(t, ctx, s, w.ID, liveAttempt, liveToken, time.Minute)
	output := json.RawMessage(`{"findings":[]}`)

	if v, err := s.Commit(ctx, w, oldAttempt, oldToken, output, 0, nil); err != nil || v != store.Lost {
		t.Fatalf("commit with the expired lease: verdict %v err %v, want lost", v, err)
	}
	if got := attemptOutcome(t, ctx, s, oldAttempt); got != "stale_lease" {
		t.Fatalf("old attempt outcome = %q, want stale_lease", got)
	}

	if v, err := s.Commit(ctx, w, liveAttempt, liveToken, output, 0, nil); err != nil || v != store.Committed {
		t.Fatalf("commit with the live lease: verdict %v err %v, want committed", v, err)
	}
	if got := attemptOutcome(t, ctx, s, liveAttempt); got != "ok" {
		t.Fatalf("committed attempt outcome = %q, want ok", got)
	}

	// A redelivered commit of the same attempt, then the old one again.
	if v, err := s.Commit(ctx, w, liveAttempt, liveToken, output, 0, nil); err != nil || v != store.Lost {
		t.Fatalf("second commit with the same token: verdict %v err %v, want lost", v, err)
	}
	if v, err := s.Commit(ctx, w, oldAttempt, oldToken, output, 0, nil); err != nil || v != store.Lost {
		t.Fatalf("second commit with the old token: verdict %v err %v, want lost", v, err)
	}
	if got := attemptOutcome(t, ctx, s, oldAttempt); got != "stale_lease" {
		t.Fatalf("old attempt outcome = %q, want stale_lease", got)
	}
	if got := attemptOutcome(t, ctx, s, liveAttempt); got != "ok" {
		t.Fatalf("accepted attempt outcome after a redelivered commit = %q, want ok", got)
	}

	if n := count(t, ctx, s, `SELECT count(*) FROM results WHERE work_id = $1`, w.ID); n != 1 {
		t.Fatalf("%d result rows, want 1", n)
	}
	res, err := s.GetResult(ctx, w.ID)
	if err != nil {
		t.Fatalf("get result: %v", err)
	}
	if res.AttemptID != liveAttempt || res.SchemaVersion != "1" {
		t.Fatalf("result attempt=%s schema=%s, want %s 1", res.AttemptID, res.SchemaVersion, liveAttempt)
	}
	cur, err := s.GetWork(ctx, w.ID)
	if err != nil {
		t.Fatalf("get work: %v", err)
	}
	if cur.State != "accepted" || cur.LeaseToken != "" || !cur.Terminal() {
		t.Fatalf("work state=%s token=%q, want accepted without a lease", cur.State, cur.LeaseToken)
	}
	if _, ok, err := s.Claim(ctx, w.ID, newUUID(), newUUID(), time.Minute, 0); err != nil || ok {
		t.Fatalf("claim on accepted work: ok=%v err=%v, want not ok", ok, err)
	}
}

func TestRejectFence(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#6", "abc"))
	oldAttempt, oldToken := newUUID(), newUUID()
	claim(t, ctx, s, w.ID, oldAttempt, oldToken, 50*time.Millisecond)
	waitLeaseExpired(t, ctx, s, w.ID)
	liveAttempt, liveToken := newUUID(), newUUID()
	w = claim(t, ctx, s, w.ID, liveAttempt, liveToken, time.Minute)

	if ok, err := s.Reject(ctx, w, oldAttempt, oldToken, "late", nil); err != nil || ok {
		t.Fatalf("reject with the expired lease: rejected=%v err=%v, want false", ok, err)
	}
	if got := attemptOutcome(t, ctx, s, oldAttempt); got != "stale_lease" {
		t.Fatalf("old attempt outcome = %q, want stale_lease", got)
	}
	if ok, err := s.Reject(ctx, w, liveAttempt, liveToken, "schema: missing findings", nil); err != nil || !ok {
		t.Fatalf("reject with the live lease: rejected=%v err=%v, want true", ok, err)
	}
	if ok, err := s.Reject(ctx, w, liveAttempt, liveToken, "schema: missing findings", nil); err != nil || ok {
		t.Fatalf("second reject with the same token: rejected=%v err=%v, want false", ok, err)
	}
	if ok, err := s.Reject(ctx, w, oldAttempt, oldToken, "late", nil); err != nil || ok {
		t.Fatalf("second reject with the old token: rejected=%v err=%v, want false", ok, err)
	}
	if v, err := s.Commit(ctx, w, liveAttempt, liveToken, json.RawMessage(`{}`), 0, nil); err != nil || v != store.Lost {
		t.Fatalf("commit after reject: verdict %v err %v, want lost", v, err)
	}
	if got := attemptOutcome(t, ctx, s, liveAttempt); got != "invalid_output" {
		t.Fatalf("rejected attempt outcome = %q, want invalid_output", got)
	}
	if got := attemptOutcome(t, ctx, s, oldAttempt); got != "stale_lease" {
		t.Fatalf("old attempt outcome = %q, want stale_lease", got)
	}
	cur, err := s.GetWork(ctx, w.ID)
	if err != nil {
		t.Fatalf("get work: %v", err)
	}
	if cur.State != "schema_rejected" || cur.Reason != "schema: missing findings" {
		t.Fatalf("work state=%s reason=%q, want schema_rejected with the gate's reason", cur.State, cur.Reason)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM results`); n != 0 {
		t.Fatalf("%d result rows after a rejection, want 0", n)
	}
}

func TestTenantForeignKeys(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#7", "abc"))

	_, err := store.Pool(s).Exec(ctx, `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token)
		VALUES ($1, $2, 'other', 1, $3)`, newUUID(), w.ID, newUUID())
	if got := sqlState(err); got != "23503" {
		t.Fatalf("attempt with another tenant: err=%v (SQLSTATE %q), want 23503", err, got)
	}
	_, err = s.AppendLedger(ctx, store.LedgerRow{AttemptID: newUUID(), TenantID: "other", WorkID: w.ID,
		Model: "m", Outcome: "ok", OccurredAt: time.Now()})
	if got := sqlState(err); got != "23503" {
		t.Fatalf("ledger row with another tenant: err=%v (SQLSTATE %q), want 23503", err, got)
	}
	_, err = store.Pool(s).Exec(ctx, `INSERT INTO ledger (attempt_id, tenant_id, work_id, model, outcome, occurred_at)
		VALUES ($1, 'other', $2, 'm', 'ok', now())`, newUUID(), w.ID)
	if got := sqlState(err); got != "23503" {
		t.Fatalf("ledger insert with another tenant: err=%v (SQLSTATE %q), want 23503", err, got)
	}
	_, err = store.Pool(s).Exec(ctx, `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token)
		VALUES ($1, $2, 'acme', 1, $3)`, newUUID(), w.ID, newUUID())
	if err != nil {
		t.Fatalf("attempt with the work's tenant: %v", err)
	}
}

func TestLedgerAndUsage(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	w := insert(t, ctx, s, newWork("acme", "octo/repo#8", "abc"))
	ow := insert(t, ctx, s, newWork("other", "octo/repo#8", "abc"))
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(24 * time.Hour)

	row := func(tenant, workID, outcome string, in, out, cost int64, at time.Time) store.LedgerRow {
		return store.LedgerRow{AttemptID: newUUID(), TenantID: tenant, WorkID: workID, Model: "assay-sim-1",
			Outcome: outcome, UpstreamAttempts: 1, InputUnits: in, OutputUnits: out, CostMicros: cost,
			LatencyMS: 10, OccurredAt: at}
	}
	first := row("acme", w.ID, "ok", 1000, 100, 210, from)
	rows := []store.LedgerRow{
		first,
		row("acme", w.ID, "ok", 500, 50, 105, from.Add(time.Hour)),
		row("acme", w.ID, "rate_limited", 0, 0, 0, to.Add(-time.Second)),
		row("acme", w.ID, "ok", 9999, 9999, 9999, to),                     // end is exclusive
		row("acme", w.ID, "ok", 9999, 9999, 9999, from.Add(-time.Second)), // before the period
		row("other", ow.ID, "ok", 7777, 7777, 7777, from.Add(time.Hour)),
	}
	for _, r := range rows {
		inserted, err := s.AppendLedger(ctx, r)
		if err != nil || !inserted {
			t.Fatalf("append %s: inserted=%v err=%v, want true", r.AttemptID, inserted, err)
		}
	}
	again := first
	again.CostMicros = 1_000_000
	inserted, err := s.AppendLedger(ctx, again)
	if err != nil || inserted {
		t.Fatalf("append the same attempt again: inserted=%v err=%v, want false", inserted, err)
	}

	got, err := s.Usage(ctx, "acme", from, to, store.ByOutcome)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	want := []store.UsageLine{
		{Key: "ok", Calls: 2, InputUnits: 1500, OutputUnits: 150, CostMicros: 315},
		{Key: "rate_limited", Calls: 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("usage = %+v, want %+v", got, want)
	}
	none, err := s.Usage(ctx, "acme", to.Add(time.Hour), to.Add(2*time.Hour), store.ByOutcome)
	if err != nil || len(none) != 0 {
		t.Fatalf("usage of an empty period = %+v, %v; want nothing", none, err)
	}
	attempts, cost, err := s.WorkCost(ctx, w.ID)
	if err != nil || attempts != 5 || cost != 210+105+9999+9999 {
		t.Fatalf("work cost = %d attempts, %d micros, %v", attempts, cost, err)
	}
}

func TestDrainOutbox(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var sent []store.OutboxMsg
	for i := range 5 {
		sent = append(sent, store.OutboxMsg{
			Stream:  "WORK",
			Subject: "assay.us.work.batch.acme",
			MsgID:   fmt.Sprintf("m%d", i),
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: map[string]string{"X-N": fmt.Sprint(i)},
		})
	}
	if err := store.InsertOutbox(ctx, s, sent); err != nil {
		t.Fatalf("insert outbox: %v", err)
	}

	work := []string{"WORK"}
	ok := func(msgs []store.OutboxMsg) []store.Sent { return make([]store.Sent, len(msgs)) }
	// The broker is unreachable before the first row: nothing is touched.
	d, err := s.DrainOutbox(ctx, 10, work, 0, store.SetAsidePolicy{}, func([]store.OutboxMsg) []store.Sent { return nil })
	if err != nil || d.Published != 0 || len(d.Failed) != 0 {
		t.Fatalf("drain publishing nothing: %+v %v", d, err)
	}

	var seen []store.OutboxMsg
	d, err = s.DrainOutbox(ctx, 10, work, 0, store.SetAsidePolicy{}, func(msgs []store.OutboxMsg) []store.Sent {
		seen = msgs
		return make([]store.Sent, 2) // then the broker went away
	})
	if err != nil || d.Published != 2 {
		t.Fatalf("partial drain: %+v %v, want 2 published", d, err)
	}
	if len(seen) != 5 {
		t.Fatalf("publish saw %d messages, want 5", len(seen))
	}
	for i, m := range seen {
		if m.MsgID != sent[i].MsgID || m.Subject != sent[i].Subject || string(m.Payload) != string(sent[i].Payload) ||
			m.Headers["X-N"] != fmt.Sprint(i) || m.ID == 0 || m.Stream != "WORK" {
			t.Fatalf("message %d = %+v, want %+v in insertion order", i, m, sent[i])
		}
	}
	var marked []string
	rows, err := store.Pool(s).Query(ctx, `SELECT msg_id FROM outbox WHERE published_at IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	marked, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	if !slices.Equal(marked, []string{"m0", "m1"}) {
		t.Fatalf("published rows = %v, want [m0 m1]", marked)
	}
	if p, err := s.PendingOutbox(ctx); err != nil || p != 3 {
		t.Fatalf("pending = %d, %v; want 3", p, err)
	}
	if b, err := s.Outbox(ctx); err != nil || b["WORK"].Pending != 3 || b["WORK"].SetAside != 0 || b["WORK"].Oldest <= 0 || b["RESULT"] != (store.OutboxBacklog{}) {
		t.Fatalf("backlog = %+v, %v; want WORK 3 waiting since a while, none set aside, RESULT empty", b, err)
	}

	d, err = s.DrainOutbox(ctx, 2, work, 0, store.SetAsidePolicy{}, func(msgs []store.OutboxMsg) []store.Sent {
		if len(msgs) != 2 || msgs[0].MsgID != "m2" {
			t.Errorf("got %d messages starting %q, want 2 starting m2", len(msgs), msgs[0].MsgID)
		}
		return ok(msgs)
	})
	if err != nil || d.Published != 2 {
		t.Fatalf("limited drain: %+v %v", d, err)
	}
	if d, err = s.DrainOutbox(ctx, 10, work, 0, store.SetAsidePolicy{}, ok); err != nil || d.Published != 1 {
		t.Fatalf("final drain: %+v %v, want 1", d, err)
	}
	d, err = s.DrainOutbox(ctx, 10, work, 0, store.SetAsidePolicy{}, func(msgs []store.OutboxMsg) []store.Sent {
		t.Error("publish called with nothing pending")
		return nil
	})
	if err != nil || d.Published != 0 {
		t.Fatalf("empty drain: %+v %v", d, err)
	}
	if p, err := s.PendingOutbox(ctx); err != nil || p != 0 {
		t.Fatalf("pending = %d, %v; want 0", p, err)
	}
}

// A row that fails to publish counts a try and is set aside past the
// policy (at once when the failure is permanent); the rows after it still
// go out; an operator's retry puts it back.
// MarkPublished marks the rows of the stream and message ids it is given
// that are still waiting, and nothing else.
func TestMarkPublished(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	msg := func(stream, id string) store.OutboxMsg {
		return store.OutboxMsg{Stream: stream, Subject: "assay.us." + strings.ToLower(stream) + ".acme", MsgID: id, Payload: []byte(`{}`)}
	}
	rows := []store.OutboxMsg{msg("WORK", "m1"), msg("WORK", "m2"), msg("RESULT", "m1"), msg("WORK", "m3")}
	if err := store.InsertOutbox(ctx, s, rows); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-time.Hour) // before the rows were written
	sent := []store.Published{{Stream: "WORK", MsgID: "m1", At: long}, {Stream: "WORK", MsgID: "m2", At: time.Now()},
		{Stream: "WORK", MsgID: "nowhere", At: time.Now()}}
	n, err := s.MarkPublished(ctx, sent)
	if err != nil || n != 2 {
		t.Fatalf("marked %d, %v; want WORK m1 and m2", n, err)
	}
	if n, err = s.MarkPublished(ctx, sent); err != nil || n != 0 {
		t.Fatalf("marked %d again, %v; want 0", n, err)
	}
	var early int
	if err := store.Pool(s).QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at < created_at`).Scan(&early); err != nil || early != 0 {
		t.Fatalf("%d rows dated published before they were written, %v", early, err)
	}
	d, err := s.DrainOutbox(ctx, 10, []string{"WORK", "RESULT"}, 0, store.SetAsidePolicy{}, func(msgs []store.OutboxMsg) []store.Sent {
		return make([]store.Sent, len(msgs))
	})
	if err != nil || d.Published != 2 {
		t.Fatalf("drained %d, %v; want the RESULT m1 and WORK m3 rows that were not marked", d.Published, err)
	}
}

func TestDrainOutboxSetsPoisonAside(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var rows []store.OutboxMsg
	for _, id := range []string{"good-1", "huge", "nowhere", "good-2"} {
		rows = append(rows, store.OutboxMsg{Stream: "WORK", Subject: "assay.us.work.batch.acme", MsgID: id, Payload: []byte(`{}`)})
	}
	if err := store.InsertOutbox(ctx, s, rows); err != nil {
		t.Fatal(err)
	}
	publish := func(msgs []store.OutboxMsg) []store.Sent {
		out := make([]store.Sent, len(msgs))
		for i, m := range msgs {
			switch m.MsgID {
			case "huge":
				out[i] = store.Sent{Err: errors.New("larger than the broker's max payload"), Permanent: true}
			case "nowhere":
				out[i] = store.Sent{Err: errors.New("no stream takes the subject")}
			}
		}
		return out
	}
	policy := store.SetAsidePolicy{MaxTries: 2, Grace: -1}
	d, err := s.DrainOutbox(ctx, 10, []string{"WORK"}, 0, policy, publish)
	if err != nil || d.Published != 2 || len(d.SetAside) != 1 || d.SetAside[0].MsgID != "huge" ||
		len(d.Failed) != 1 || d.Failed[0].MsgID != "nowhere" || d.Failed[0].Tries != 1 {
		t.Fatalf("first drain: %+v %v", d, err)
	}
	d, err = s.DrainOutbox(ctx, 10, []string{"WORK"}, 0, policy, publish)
	if err != nil || len(d.SetAside) != 1 || d.SetAside[0].MsgID != "nowhere" || d.SetAside[0].Tries != 2 ||
		!strings.Contains(d.SetAside[0].Err, "no stream") {
		t.Fatalf("second drain: %+v %v", d, err)
	}
	if p, err := s.PendingOutbox(ctx); err != nil || p != 0 {
		t.Fatalf("pending = %d, %v; want 0 (set-aside rows are out of the queue)", p, err)
	}
	aside, err := s.SetAsideRows(ctx, 10)
	if err != nil || len(aside) != 2 || aside[0].MsgID != "huge" || aside[1].LastError == "" {
		t.Fatalf("set-aside rows: %+v %v", aside, err)
	}
	if b, err := s.Outbox(ctx); err != nil || b["WORK"] != (store.OutboxBacklog{SetAside: 2}) {
		t.Fatalf("backlog = %+v, %v; want WORK with 2 set aside and none waiting", b, err)
	}
	if n, err := s.RetrySetAside(ctx, []int64{aside[1].ID}); err != nil || n != 1 {
		t.Fatalf("retry one: %d %v", n, err)
	}
	d, err = s.DrainOutbox(ctx, 10, []string{"WORK"}, 0, policy, func(msgs []store.OutboxMsg) []store.Sent {
		return make([]store.Sent, len(msgs))
	})
	if err != nil || d.Published != 1 {
		t.Fatalf("after the retry: %+v %v", d, err)
	}
	if n, err := s.RetrySetAside(ctx, nil); err != nil || n != 1 {
		t.Fatalf("retry all: %d %v", n, err)
	}
}

// A row that fails during the grace is not set aside, however often: a
// broker that restarts sets nothing aside.
func TestDrainOutboxGraceKeepsRowsInTheQueue(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	if err := store.InsertOutbox(ctx, s, []store.OutboxMsg{{Stream: "WORK", Subject: "assay.us.work.batch.acme", MsgID: "m", Payload: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	fail := func(msgs []store.OutboxMsg) []store.Sent { return []store.Sent{{Err: errors.New("no ack")}} }
	for range 5 {
		d, err := s.DrainOutbox(ctx, 10, []string{"WORK"}, 0, store.SetAsidePolicy{MaxTries: 2, Grace: time.Hour}, fail)
		if err != nil || len(d.SetAside) != 0 || len(d.Failed) != 1 {
			t.Fatalf("%+v %v", d, err)
		}
	}
}

func TestSweepStuck(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	oldQueued := insert(t, ctx, s, newWork("acme", "octo/repo#9", "old"))
	insert(t, ctx, s, newWork("acme", "octo/repo#9", "fresh"))
	expired := insert(t, ctx, s, newWork("acme", "octo/repo#9", "expired"))
	live := insert(t, ctx, s, newWork("acme", "octo/repo#9", "live"))
	done := insert(t, ctx, s, newWork("acme", "octo/repo#9", "done"))

	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET updated_at = now() - interval '1 hour' WHERE id = ANY($1)`,
		[]string{oldQueued.ID, done.ID}); err != nil {
		t.Fatalf("age work: %v", err)
	}
	if ok, err := s.FinishUnleased(ctx, done.ID, "canceled", "caller canceled"); err != nil || !ok {
		t.Fatalf("finish unleased: ok=%v err=%v", ok, err)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET updated_at = now() - interval '1 hour' WHERE id = $1`, done.ID); err != nil {
		t.Fatalf("age work: %v", err)
	}
	claim(t, ctx, s, expired.ID, newUUID(), newUUID(), 50*time.Millisecond)
	claim(t, ctx, s, live.ID, newUUID(), newUUID(), time.Minute)
	waitLeaseExpired(t, ctx, s, expired.ID)

	before := count(t, ctx, s, `SELECT count(*) FROM outbox`)
	var announced []string
	announce := func(st store.Stuck) (store.OutboxMsg, error) {
		announced = append(announced, st.Work.ID)
		return store.OutboxMsg{Stream: "WORK", Subject: "assay.us.work.interactive.acme", MsgID: fmt.Sprintf("%s.%d", st.Work.ID, st.Dispatch), Payload: []byte("{}")}, nil
	}
	graced, err := s.SweepStuck(ctx, store.Sweep{QueuedFor: 10 * time.Minute, LeaseGrace: time.Hour, Limit: 100}, announce)
	if err != nil {
		t.Fatalf("sweep with a long grace: %v", err)
	}
	if len(graced) != 1 || graced[0].Work.ID != oldQueued.ID {
		t.Fatalf("sweep with a long grace found %v, want only %s", stuckIDs(graced), oldQueued.ID)
	}

	// The first pass touched the queued work: only the expired lease is
	// left for a pass with no grace.
	stuck, err := s.SweepStuck(ctx, store.Sweep{QueuedFor: 10 * time.Minute, Limit: 100}, announce)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if len(stuck) != 1 || stuck[0].Work.ID != expired.ID {
		t.Fatalf("sweep after the first found %v, want only %s", stuckIDs(stuck), expired.ID)
	}
	if _, err := store.Pool(s).Exec(ctx, `UPDATE work SET updated_at = now() - interval '1 hour' WHERE id = $1`, oldQueued.ID); err != nil {
		t.Fatalf("age work: %v", err)
	}
	waitLeaseExpired(t, ctx, s, expired.ID)
	stuck, err = s.SweepStuck(ctx, store.Sweep{QueuedFor: 10 * time.Minute, Limit: 100}, announce)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if len(stuck) != 2 {
		t.Fatalf("sweep found %v, want %s and %s", stuckIDs(stuck), oldQueued.ID, expired.ID)
	}
	byID := map[string]store.Stuck{}
	for _, st := range stuck {
		byID[st.Work.ID] = st
	}
	q, ok := byID[oldQueued.ID]
	if !ok || q.Redrive || q.Dispatch != 3 {
		t.Fatalf("queued work in sweep = %+v (found %v), want no redrive, dispatch 3 (a new message each time)", q, ok)
	}
	r, ok := byID[expired.ID]
	if !ok || !r.Redrive || r.Dispatch != 3 {
		t.Fatalf("expired work in sweep = %+v (found %v), want redrive, dispatch 3", r, ok)
	}
	cur, err := s.GetWork(ctx, expired.ID)
	if err != nil || cur.Dispatch != 3 {
		t.Fatalf("expired work dispatch = %v, %v; want 3", cur, err)
	}
	// Every pass wrote its announcements in the same transaction.
	if n := count(t, ctx, s, `SELECT count(*) FROM outbox`) - before; n != 4 || len(announced) != 4 {
		t.Fatalf("%d outbox rows written for %v, want 4", n, announced)
	}
	again, err := s.SweepStuck(ctx, store.Sweep{QueuedFor: 10 * time.Minute, LeaseGrace: time.Hour, Limit: 100}, announce)
	if err != nil || len(again) != 0 {
		t.Fatalf("sweep right after found %v, %v; want nothing", stuckIDs(again), err)
	}
}

// Queued work whose announcement still waits in a backlog is left alone:
// only work announced before the lane's backlog head, whose message was
// delivered or lost, is announced again; work due for a later retry waits.
func TestSweepLeavesABacklogAlone(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	lost := insert(t, ctx, s, newWork("acme", "octo/repo#10", "lost"))
	waiting := insert(t, ctx, s, newWork("acme", "octo/repo#10", "waiting"))
	retrying := insert(t, ctx, s, newWork("acme", "octo/repo#10", "retrying"))
	db := store.Pool(s)
	for id, age := range map[string]string{lost.ID: "2 hours", waiting.ID: "1 hour", retrying.ID: "2 hours"} {
		if _, err := db.Exec(ctx, `UPDATE work SET updated_at = now() - $2::interval WHERE id = $1`, id, age); err != nil {
			t.Fatal(err)
		}
	}
	// A 429 asked for two hours' patience.
	if _, err := db.Exec(ctx, `UPDATE work SET retry_at = now() + interval '1 hour' WHERE id = $1`, retrying.ID); err != nil {
		t.Fatal(err)
	}
	announce := func(st store.Stuck) (store.OutboxMsg, error) {
		return store.OutboxMsg{Stream: "WORK", Subject: "assay.us.work.batch.acme", MsgID: fmt.Sprintf("%s.%d", st.Work.ID, st.Dispatch), Payload: []byte("{}")}, nil
	}
	head := time.Now().Add(-90 * time.Minute) // the batch consumer's next undelivered message
	stuck, err := s.SweepStuck(ctx, store.Sweep{QueuedFor: time.Minute, Heads: map[string]time.Time{"batch": head}, Limit: 100}, announce)
	if err != nil {
		t.Fatal(err)
	}
	if ids := stuckIDs(stuck); len(ids) != 1 || ids[0] != lost.ID {
		t.Fatalf("swept %v, want only %s (the other two wait in the backlog or for their retry)", ids, lost.ID)
	}
}

func stuckIDs(st []store.Stuck) []string {
	var ids []string
	for _, s := range st {
		ids = append(ids, s.Work.ID)
	}
	return ids
}

// The database's CHECK constraint and the outcome package name the same
// work states: one vocabulary in the database, events, metrics, logs and
// the API.
func TestWorkStatesMatchTheVocabulary(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	var def string
	if err := store.Pool(s).QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = 'work'::regclass AND conname = 'work_state_check'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	var inDB []string
	for _, m := range regexp.MustCompile(`'([a-z_]+)'::text`).FindAllStringSubmatch(def, -1) {
		inDB = append(inDB, m[1])
	}
	got, want := slices.Sorted(slices.Values(inDB)), slices.Sorted(slices.Values(outcome.WorkStates))
	if !slices.Equal(got, want) {
		t.Fatalf("work_state_check allows %v; package outcome names %v", got, want)
	}
}

// Retention: published outbox rows past their age go; inputs and raw
// answers of work that ended long ago go, the rows that tell what happened
// stay; live work keeps everything.
func TestPurge(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	done := insert(t, ctx, s, newWork("acme", "octo/repo#11", "done"))
	live := insert(t, ctx, s, newWork("acme", "octo/repo#12", "live"))
	for _, w := range []*store.Work{done, live} {
		attempt, token := newUUID(), newUUID()
		claim(t, ctx, s, w.ID, attempt, token, time.Minute)
		if _, err := s.RecordAttempt(ctx, store.AttemptRecord{AttemptID: attempt, WorkID: w.ID, LeaseToken: token,
			Outcome: "ok", Raw: []byte(`{"answer":1}`), Change: store.Handoff, HandoffTTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	db := store.Pool(s)
	if _, err := db.Exec(ctx, `UPDATE work SET state = 'schema_rejected', lease_token = NULL, lease_expires_at = NULL,
		updated_at = now() - interval '40 days' WHERE id = $1`, done.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '2 days', published_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	p, err := s.Purge(ctx, store.Retention{Outbox: 24 * time.Hour, Data: 30 * 24 * time.Hour, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if p.Outbox != 2 || p.Inputs != 1 || p.Answers != 1 {
		t.Fatalf("purged %+v, want 2 outbox rows, 1 input, 1 answer", p)
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM work WHERE id = $1 AND input = '' AND state = 'schema_rejected'`, done.ID); n != 1 {
		t.Fatal("the ended work lost more than its input")
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE work_id = $1 AND raw_response IS NOT NULL`, live.ID); n != 1 {
		t.Fatal("live work lost its answer")
	}
	if n := count(t, ctx, s, `SELECT count(*) FROM attempts WHERE work_id = $1`, done.ID); n != 1 {
		t.Fatal("the attempt row itself went")
	}
}

// A URL that carries the pool's own settings (pool_max_conns) creates its
// missing database as any other: those settings are the pool's, never sent
// to the server as parameters.
func TestEnsureDatabaseWithPoolSettings(t *testing.T) {
	base, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("assay_ensure_%d", time.Now().UnixNano())
	u := *base
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", "8")
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base.String())
		if err == nil {
			_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name)
			conn.Close(context.Background())
		}
	})
	for i, want := range []bool{true, false} {
		created, err := store.EnsureDatabase(t.Context(), u.String())
		if err != nil || created != want {
			t.Fatalf("call %d: created %v, err %v; want created %v", i+1, created, err, want)
		}
	}
	s := open(t, u.String())
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Unsent tells an error that came before the statement reached the server
// (nothing done, safe to send again) from one the server answered.
func TestUnsent(t *testing.T) {
	s, ctx := setup(t)
	base, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	base.Path = "/assay_no_such_database"
	gone, err := store.Open(ctx, base.String())
	if err == nil {
		gone.Close()
		t.Fatal("opened a database that does not exist")
	}
	if !store.Unsent(err) {
		t.Fatalf("a connection refused by the server: Unsent(%v) = false, want true", err)
	}
	_, err = s.RecordAttempt(ctx, store.AttemptRecord{AttemptID: "not-a-uuid", WorkID: "w_none", LeaseToken: newUUID(),
		Outcome: outcome.AttemptOK, Change: store.Finish, WorkOutcome: outcome.Accepted})
	if err == nil || store.Unsent(err) {
		t.Fatalf("a statement the server refused: Unsent(%v) = true, want false", err)
	}
}

// A statement the store sends is planned for its own values every time:
// a plan cached while a new cell's tables were nearly empty would keep
// scanning them whole as they grow (the commit group did, a sequential
// scan of attempts per accepted row). The URL's own setting wins.
func TestPlansAreMadeForEachExecution(t *testing.T) {
	ctx := t.Context()
	u := testenv.Database(t)
	for _, c := range []struct{ url, want string }{
		{u, "force_custom_plan"},
		{withQuery(t, u, "plan_cache_mode", "auto"), "auto"},
	} {
		s := open(t, c.url)
		var got string
		if err := store.Pool(s).QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: plan_cache_mode %q, want %q", c.url, got, c.want)
		}
	}
}

func withQuery(t *testing.T, raw, key, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}
