package committer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// memStore is the commit path of a Store in memory, for the tests of the
// committer's decisions about RESULT events. It holds the rows the commit
// path reads and writes (work, attempts, results, the outbox) and, put
// there through its storeFacts methods, what the rest of the cell writes
// first: tenants, work, claims and answers. TestStoreConformance holds it
// to what *store.Store does.
//
// It implements the four methods the commit path calls: WorkAnswerGroup,
// CommitGroup, MarkStale and Reject. The rest of Store (Ping, WorkAnswer,
// Commit, UncommittedResults, AnnounceOutcomes, UnpublishedOutcomes,
// AdvanceOutcomeMark, the outbox relay's and the publisher's) is the
// embedded interface, unset:
// calling one panics. A committer on a memStore is never started, reaped
// or asked whether it is ready.
//
// It is smaller than the database where the commit path cannot tell. Its
// clock is the process's where the database's is now(). It makes none of
// the database's refusals: of an output jsonb cannot hold, of an id that
// is not a UUID, of a result whose attempt it does not hold, of a second
// result for running work. It keeps an attempt's raw answer alone, where
// the database reads what a review's parts answered together first, and
// no attempt numbers or finish times.
type memStore struct {
	Store

	t  *testing.T
	mu sync.Mutex
	// down, when set, is what every method of the commit path fails with.
	down error

	tenants   map[string]bool
	works     map[string]*store.Work
	attempts  map[string]*memAttempt
	results   map[resultKey]memResult
	outbox    []store.OutboxMsg // in the order written
	announced map[string]bool   // work whose outcome is announced
}

type memAttempt struct {
	work, token     string
	outcome, reason string // "" while the call runs
	raw             []byte // nil: it kept no answer
}

// resultKey is the results table's key: one result per work and schema
// version.
type resultKey struct{ work, version string }

type memResult struct {
	attempt  string
	output   []byte
	findings int
}

var (
	_ Store      = (*memStore)(nil)
	_ storeFacts = (*memStore)(nil)
)

// newMemStore is an empty memStore; a fact it cannot hold fails t.
func newMemStore(t *testing.T) *memStore {
	return &memStore{t: t, tenants: map[string]bool{}, works: map[string]*store.Work{}, attempts: map[string]*memAttempt{},
		results: map[resultKey]memResult{}, announced: map[string]bool{}}
}

// The reasons the database's statements write.
const (
	reasonLapsed  = "the lease lapsed before the worker reported back"
	reasonLost    = "lease lost before the verdict"
	reasonLate    = "deadline passed before the verdict"
	reasonExpired = "deadline passed before a result was accepted"
)

func (m *memStore) WorkAnswerGroup(_ context.Context, reqs []store.AnswerReq) []store.Answer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.Answer, len(reqs))
	for i, r := range reqs {
		w, ok := m.works[r.WorkID]
		switch {
		case m.down != nil:
			out[i].Err = m.down
		case !ok:
			out[i].Err = store.ErrNotFound
		default:
			c := *w
			out[i].Work = &c
			if a, ok := m.attempts[r.AttemptID]; ok && a.work == r.WorkID {
				out[i].Answer = slices.Clone(a.raw)
			}
		}
	}
	return out
}

func (m *memStore) CommitGroup(_ context.Context, reqs []store.CommitReq) []store.CommitVerdict {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.CommitVerdict, len(reqs))
	for i, r := range reqs {
		if m.down != nil {
			out[i] = store.CommitVerdict{Verdict: store.Lost, Err: m.down}
			continue
		}
		out[i].Verdict = m.commit(r)
	}
	return out
}

// commit decides one answer as the database's statement does: while the
// request's token is the running work's lease, the work is accepted with
// the answer as its result, or expired when its deadline has passed;
// otherwise the attempt is marked as lost, which leaves the attempt that
// holds the result as it is.
func (m *memStore) commit(r store.CommitReq) store.Verdict {
	now := time.Now()
	w, ok := m.works[r.Work.ID]
	if !ok || w.State != outcome.Running || w.LeaseToken != r.Token {
		m.markLost(r.AttemptID)
		return store.Lost
	}
	state, reason, v, events := outcome.Accepted, "", store.Committed, r.Accepted
	if !w.DeadlineAt.After(now) {
		state, reason, v, events = outcome.Expired, reasonExpired, store.Late, r.Expired
	}
	m.end(w, state, reason, r.Announce)
	a := m.attempts[r.AttemptID]
	switch {
	case a == nil:
	case v == store.Late:
		a.outcome, a.reason = outcome.AttemptStaleLease, reasonLate
	default:
		a.outcome, a.reason = outcome.AttemptOK, ""
	}
	if v == store.Committed {
		m.results[resultKey{w.ID, r.Work.SchemaVersion}] = memResult{attempt: r.AttemptID, output: slices.Clone(r.Output),
			findings: r.Findings}
	}
	m.outbox = append(m.outbox, events...)
	return v
}

// end gives leased work its outcome and lets the lease go; announced says
// the outcome's events are written with it.
func (m *memStore) end(w *store.Work, state, reason string, announced bool) {
	w.State, w.Reason, w.LeaseToken, w.LeaseExpiresAt, w.UpdatedAt = state, reason, "", time.Time{}, time.Now()
	if announced {
		m.announced[w.ID] = true
	}
}

// markLost records stale_lease on an attempt whose verdict came too late,
// keeping a reason it has; an attempt that holds its work's result, or has
// another outcome, keeps it. It says whether the attempt changed.
func (m *memStore) markLost(attempt string) bool {
	a, ok := m.attempts[attempt]
	if !ok || !slices.Contains([]string{"", outcome.AttemptOK, outcome.AttemptLeaseExpired}, a.outcome) || m.holdsResult(attempt) {
		return false
	}
	a.outcome = outcome.AttemptStaleLease
	if a.reason == "" {
		a.reason = reasonLost
	}
	return true
}

// holdsResult reports whether the attempt's answer is its work's result.
func (m *memStore) holdsResult(attempt string) bool {
	for k, r := range m.results {
		if r.attempt == attempt && k.work == m.attempts[attempt].work {
			return true
		}
	}
	return false
}

func (m *memStore) MarkStale(_ context.Context, attempt string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return false, m.down
	}
	return m.markLost(attempt), nil
}

func (m *memStore) Reject(_ context.Context, w *store.Work, attempt, token, reason string, announce store.Announce) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return false, m.down
	}
	have, ok := m.works[w.ID]
	if !ok || have.State != outcome.Running || have.LeaseToken != token {
		m.markLost(attempt)
		return false, nil
	}
	// The announcement is made before anything changes: when it fails,
	// the database's transaction leaves everything as it was.
	var events []store.OutboxMsg
	if announce != nil {
		var err error
		if events, err = announce(w, outcome.SchemaRejected); err != nil {
			return false, err
		}
	}
	reason = store.Text(reason)
	m.end(have, outcome.SchemaRejected, reason, announce != nil)
	if a, ok := m.attempts[attempt]; ok {
		a.outcome, a.reason = outcome.AttemptInvalidOutput, reason
	}
	m.outbox = append(m.outbox, events...)
	return true, nil
}

// The facts.

func (m *memStore) Tenant(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenants[id] = true
}

func (m *memStore) Work(w store.Work) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.tenants[w.TenantID] {
		m.t.Fatalf("memstore: no tenant %s for work %s", w.TenantID, w.ID)
	}
	if _, ok := m.works[w.ID]; ok {
		m.t.Fatalf("memstore: work %s already stored", w.ID)
	}
	now := time.Now()
	w.State, w.Reason, w.LeaseToken, w.LeaseExpiresAt, w.CreatedAt, w.UpdatedAt = outcome.Queued, "", "", time.Time{}, now, now
	m.works[w.ID] = &w
}

func (m *memStore) Claim(work, attempt string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	w, ok := m.works[work]
	switch {
	case !ok:
		m.t.Fatalf("memstore: no work %s to claim", work)
	case w.State != outcome.Queued && !(w.State == outcome.Running && w.LeaseExpiresAt.Before(now)):
		m.t.Fatalf("memstore: work %s is %s and not free to claim", work, w.State)
	}
	if _, ok := m.attempts[attempt]; ok {
		m.t.Fatalf("memstore: attempt %s already claimed", attempt)
	}
	for _, a := range m.attempts {
		if a.work == work && a.outcome == "" {
			a.outcome, a.reason = outcome.AttemptLeaseExpired, reasonLapsed
		}
	}
	w.State, w.LeaseToken, w.LeaseExpiresAt, w.UpdatedAt = outcome.Running, leaseToken(attempt), now.Add(time.Minute), now
	w.Attempts++
	m.attempts[attempt] = &memAttempt{work: work, token: leaseToken(attempt)}
}

func (m *memStore) Lapse(work string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.works[work]
	if !ok || w.State != outcome.Running {
		m.t.Fatalf("memstore: no running work %s to lapse", work)
	}
	w.LeaseExpiresAt = time.Now().Add(-time.Second)
}

func (m *memStore) Overdue(work string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.works[work]
	if !ok {
		m.t.Fatalf("memstore: no work %s", work)
	}
	w.DeadlineAt = time.Now().Add(-time.Second)
}

func (m *memStore) Answer(attempt string, raw []byte) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.attempts[attempt]
	if !ok {
		m.t.Fatalf("memstore: attempt %s never claimed", attempt)
	}
	w := m.works[a.work]
	if w.State != outcome.Running || w.LeaseToken != a.token {
		m.t.Fatalf("memstore: attempt %s no longer holds work %s", attempt, a.work)
	}
	a.outcome, a.reason = outcome.AttemptOK, ""
	if len(raw) > 0 {
		a.raw = slices.Clone(raw)
	}
	w.LeaseExpiresAt = time.Now().Add(time.Minute)
}

func (m *memStore) Down() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = errors.New("memstore: the database does not answer")
}

func (m *memStore) Attempt(id string) (string, string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.attempts[id]
	if !ok {
		m.t.Fatalf("memstore: no attempt %s", id)
	}
	return a.outcome, a.reason
}

func (m *memStore) Result(work string) (resultFact, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.results {
		if k.work == work {
			return resultFact{Attempt: r.attempt, Output: slices.Clone(r.output), Findings: r.findings}, true
		}
	}
	return resultFact{}, false
}

func (m *memStore) Outbox() []store.OutboxMsg {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.OutboxMsg, len(m.outbox))
	for i, e := range m.outbox {
		out[i] = store.OutboxMsg{Stream: e.Stream, Subject: e.Subject, MsgID: e.MsgID, Payload: slices.Clone(e.Payload)}
	}
	return out
}

// work is the work as the store holds it.
func (m *memStore) work(id string) store.Work {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.works[id]
	if !ok {
		m.t.Fatalf("memstore: no work %s", id)
	}
	return *w
}

func (m *memStore) Announced(work string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.announced[work]
}
