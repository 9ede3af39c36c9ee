package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// memStore is a Store in memory, for the tests of the ledger's decisions.
// It holds the ledger's rows and, put there through its storeFacts methods,
// what the rest of the cell writes and the ledger reads: tenants, claimed
// attempts, budget reservations and outbox events. TestStoreConformance
// holds it to what *store.Store does.
//
// It is smaller than the database where the ledger cannot tell. Its clock
// is the process's where the database's is now(), and it keeps times to
// the nanosecond where the database keeps microseconds. The only row it
// refuses for good is one whose work it does not hold, the ledger's foreign
// key; the database's other refusals (bytes that are not text) it does not
// make. It keeps no budget totals, which the ledger never reads, and no
// work states: work is running from its first claim on.
type memStore struct {
	t  *testing.T
	mu sync.Mutex
	// down, when set, is what every method fails with.
	down error

	tenants      map[string]store.Tenant
	tokens       map[string]string // token → tenant id
	works        map[string]*memWork
	attempts     map[string]*memAttempt
	reservations map[string]*memReservation // by attempt id
	outbox       []memEvent                 // in the order written
	ledger       map[string]*store.LedgerRow
}

type memWork struct {
	tenant       string
	attempts     int
	leaseToken   string
	leaseExpires time.Time
}

type memAttempt struct {
	id, work, tenant string
	number           int
	leaseToken       string
	started          time.Time
	estimate         int64
	outcome          string // "" while the call runs
}

type memReservation struct {
	amount  int64
	created time.Time
	settled bool
}

type memEvent struct {
	stream, msgID string
	payload       []byte
	noCall        bool
	written       time.Time
	published     time.Time // zero until published
}

var (
	_ Store      = (*memStore)(nil)
	_ storeFacts = (*memStore)(nil)
)

// newMemStore is an empty memStore; a fact it cannot hold fails t.
func newMemStore(t *testing.T) *memStore {
	return &memStore{t: t, tenants: map[string]store.Tenant{}, tokens: map[string]string{}, works: map[string]*memWork{},
		attempts: map[string]*memAttempt{}, reservations: map[string]*memReservation{}, ledger: map[string]*store.LedgerRow{}}
}

// row is the ledger's row of the attempt.
func (m *memStore) row(attempt string) (store.LedgerRow, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.ledger[attempt]
	if !ok {
		return store.LedgerRow{}, false
	}
	return *r, true
}

// rows counts the ledger's rows.
func (m *memStore) rows() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ledger)
}

func (m *memStore) Ping(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.down
}

func (m *memStore) TenantByToken(_ context.Context, token string) (store.Tenant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return store.Tenant{}, m.down
	}
	id, ok := m.tokens[token]
	if !ok {
		return store.Tenant{}, store.ErrNotFound
	}
	return m.tenants[id], nil
}

func (m *memStore) RecordLedgerBatch(_ context.Context, rows []store.LedgerRow) []store.LedgerResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]store.LedgerResult, len(rows))
	for i, r := range rows {
		if m.down != nil {
			out[i].Err = m.down
			continue
		}
		out[i] = m.record(r)
	}
	return out
}

// record records one row as the database's statement does: a new row
// settles its attempt's reservation, an attempt's report replaces its
// estimate, and anything else changes nothing.
func (m *memStore) record(r store.LedgerRow) store.LedgerResult {
	if had, ok := m.ledger[r.AttemptID]; ok {
		if r.Estimated || !had.Estimated {
			return store.LedgerResult{Recorded: store.Duplicate}
		}
		*had = r
		return store.LedgerResult{Recorded: store.Replaced}
	}
	if w, ok := m.works[r.WorkID]; !ok || w.tenant != r.TenantID {
		return store.LedgerResult{Err: fmt.Errorf("store: ledger %s: %w", r.AttemptID,
			&pgconn.PgError{Code: "23503", Message: "no work " + r.WorkID + " of tenant " + r.TenantID})}
	}
	m.ledger[r.AttemptID] = &r
	var excess int64
	if res, ok := m.reservations[r.AttemptID]; ok && !res.settled {
		res.settled = true
		excess = max(r.CostMicros-res.amount, 0)
	}
	return store.LedgerResult{Recorded: store.Inserted, Excess: excess}
}

func (m *memStore) UnrecordedEvents(_ context.Context, stream string, grace, horizon time.Duration, limit int) ([][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return nil, m.down
	}
	now := time.Now()
	events := slices.Clone(m.outbox)
	slices.SortStableFunc(events, func(a, b memEvent) int { return a.written.Compare(b.written) })
	var out [][]byte
	for _, e := range events {
		_, recorded := m.ledger[e.msgID]
		if len(out) < limit && e.stream == stream && !e.noCall && e.written.After(now.Add(-horizon)) &&
			!e.published.IsZero() && e.published.Before(now.Add(-grace)) && !recorded {
			out = append(out, e.payload)
		}
	}
	return out, nil
}

func (m *memStore) DeadAttempts(_ context.Context, grace time.Duration, limit int) ([]store.DeadAttempt, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return nil, m.down
	}
	since := time.Now().Add(-grace)
	var dead []*memAttempt
	for _, a := range m.attempts {
		w := m.works[a.work]
		_, recorded := m.ledger[a.id]
		switch {
		case a.outcome != "" && a.outcome != outcome.AttemptLeaseExpired, !a.started.Before(since),
			w.leaseToken == a.leaseToken && w.leaseExpires.After(since), recorded, m.written(a.id):
			continue
		}
		dead = append(dead, a)
	}
	slices.SortFunc(dead, func(a, b *memAttempt) int { return a.started.Compare(b.started) })
	out := []store.DeadAttempt{}
	for _, a := range dead[:min(len(dead), limit)] {
		if a.outcome == "" {
			a.outcome = outcome.AttemptLeaseExpired
		}
		charge := a.estimate
		if r, ok := m.reservations[a.id]; ok && !r.settled {
			charge = max(charge, r.amount)
		}
		out = append(out, store.DeadAttempt{AttemptID: a.id, WorkID: a.work, TenantID: a.tenant, Number: a.number,
			StartedAt: a.started, ChargeMicros: charge, Model: m.reportedModel(a.work)})
	}
	return out, nil
}

// written reports whether the outbox holds an event with the message id.
func (m *memStore) written(msgID string) bool {
	return slices.ContainsFunc(m.outbox, func(e memEvent) bool { return e.msgID == msgID })
}

// reportedModel is the model of a row of the work that is not an
// estimate, or "unknown".
func (m *memStore) reportedModel(work string) string {
	for _, r := range m.ledger {
		if r.WorkID == work && !r.Estimated {
			return r.Model
		}
	}
	return "unknown"
}

func (m *memStore) ReleaseOrphanReservations(_ context.Context, grace time.Duration) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return 0, m.down
	}
	var n int64
	since := time.Now().Add(-grace)
	for id, r := range m.reservations {
		if _, claimed := m.attempts[id]; !r.settled && r.created.Before(since) && !claimed {
			delete(m.reservations, id)
			n++
		}
	}
	return n, nil
}

func (m *memStore) Usage(_ context.Context, tenant string, from, to time.Time, by string) ([]store.UsageLine, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down != nil {
		return nil, m.down
	}
	if by != store.ByOutcome && by != store.ByModel {
		return nil, fmt.Errorf("store: usage by %q", by)
	}
	lines := map[string]*store.UsageLine{}
	for _, r := range m.ledger {
		if r.TenantID != tenant || r.OccurredAt.Before(from) || !r.OccurredAt.Before(to) {
			continue
		}
		key := r.Outcome
		if by == store.ByModel {
			key = r.Model
		}
		l := lines[key]
		if l == nil {
			l = &store.UsageLine{Key: key}
			lines[key] = l
		}
		l.Calls++
		l.InputUnits += r.InputUnits
		l.OutputUnits += r.OutputUnits
		l.CachedInputUnits += r.CachedInputUnits
		l.ReasoningUnits += r.ReasoningUnits
		l.CostMicros += r.CostMicros
		if r.Estimated {
			l.EstimatedCalls++
			l.EstimatedCostMicros += r.CostMicros
		}
	}
	// Byte order, which is the cell database's collation (C.UTF-8).
	out := []store.UsageLine{}
	for _, k := range slices.Sorted(maps.Keys(lines)) {
		out = append(out, *lines[k])
	}
	return out, nil
}

// The facts.

func (m *memStore) Tenant(id, home, token string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenants[id] = store.Tenant{ID: id, HomeRegion: home, Status: store.TenantActive, RatePerMinute: 600, Burst: 60}
	m.tokens[token] = id
}

func (m *memStore) Suspend(tenant string) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	tn, ok := m.tenants[tenant]
	if !ok {
		m.t.Fatalf("memstore: no tenant %s to suspend", tenant)
	}
	tn.Status = store.TenantSuspended
	m.tenants[tenant] = tn
}

func (m *memStore) Reserve(tenant, attempt string, amount int64, age time.Duration) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.tenants[tenant]; !ok {
		m.t.Fatalf("memstore: no tenant %s to reserve for", tenant)
	}
	if _, ok := m.reservations[attempt]; ok {
		m.t.Fatalf("memstore: attempt %s already holds a reservation", attempt)
	}
	m.reservations[attempt] = &memReservation{amount: amount, created: time.Now().Add(-age)}
}

func (m *memStore) Claim(c claimFact) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	w, ok := m.works[c.Work]
	switch {
	case !ok:
		if _, ok := m.tenants[c.Tenant]; !ok {
			m.t.Fatalf("memstore: no tenant %s to claim work for", c.Tenant)
		}
		w = &memWork{tenant: c.Tenant}
		m.works[c.Work] = w
	case w.tenant != c.Tenant:
		m.t.Fatalf("memstore: work %s is tenant %s's", c.Work, w.tenant)
	case w.leaseExpires.After(now):
		m.t.Fatalf("memstore: work %s is leased", c.Work)
	}
	if _, ok := m.attempts[c.Attempt]; ok {
		m.t.Fatalf("memstore: attempt %s already claimed", c.Attempt)
	}
	for _, a := range m.attempts {
		if a.work == c.Work && a.outcome == "" {
			a.outcome = outcome.AttemptLeaseExpired
		}
	}
	w.attempts++
	w.leaseToken, w.leaseExpires = leaseToken(c.Attempt), now.Add(c.Lease)
	m.attempts[c.Attempt] = &memAttempt{id: c.Attempt, work: c.Work, tenant: c.Tenant, number: w.attempts,
		leaseToken: w.leaseToken, started: now.Add(-c.Age), estimate: c.Estimate}
}

func (m *memStore) Report(attempt, result string, events ...eventFact) {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.attempts[attempt]
	if !ok {
		m.t.Fatalf("memstore: attempt %s never claimed", attempt)
	}
	a.outcome = result
	now := time.Now()
	for _, e := range events {
		ev := memEvent{stream: e.Stream, msgID: attempt, payload: e.Payload, noCall: e.NoCall, written: now.Add(-e.Written)}
		if e.OnRow {
			ev.published = ev.written
		} else if e.Published >= 0 {
			ev.published = now.Add(-e.Published)
		}
		m.outbox = append(m.outbox, ev)
	}
}

func (m *memStore) Down() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = errors.New("memstore: the database does not answer")
}
