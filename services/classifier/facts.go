package classifier

import (
	"context"
	"sync"
	"time"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// A work announcement carries the row's facts (event.FactsHeader), and a
// worker that can decide on them claims without reading the row: the claim
// expects each fact of the row (store.Expect) and returns the row. Facts
// only ever lead to a claim. Whatever else they would decide (the work
// ends, waits, or is refused), and every claim they lose, is decided again
// on the row, read as before.

// readRow is claim's answer for a job on facts that cannot go on with
// them: read the row and decide again. It is never a job on facts' last
// word, so it is told apart from an ack (the same value) by the job.
var readRow = consumer.Disposition{}

// job is the work an announcement names: on its facts where they suffice,
// else read from its row.
func (s *Service) job(ctx context.Context, ev event.Work, d consumer.Delivery, need time.Duration) (job, consumer.Disposition, bool) {
	if j, ok := s.onFacts(ctx, ev, d, need); ok {
		return j, consumer.Disposition{}, true
	}
	return s.read(ctx, ev, need)
}

// budgetFresh is how long a tenant's having a budget, learned from a read,
// is taken on trust for a claim on facts (which checks it again).
const budgetFresh = time.Minute

// budgets remembers, per tenant, whether it had a budget when a row of its
// work was last read.
type budgets struct {
	m sync.Map // tenant -> budgetSeen
}

type budgetSeen struct {
	budgeted bool
	at       time.Time
}

func (b *budgets) saw(tenant string, budgeted bool) {
	b.m.Store(tenant, budgetSeen{budgeted: budgeted, at: time.Now()})
}

func (b *budgets) known(tenant string) (budgeted, ok bool) {
	v, found := b.m.Load(tenant)
	if !found {
		return false, false
	}
	seen := v.(budgetSeen)
	return seen.budgeted, time.Since(seen.at) < budgetFresh
}

// job is the work one delivery runs: read from its row, or as its
// announcement's facts give it (facts set).
type job struct {
	w        *store.Work
	budgeted bool
	c        *contract.Contract
	facts    *event.WorkFacts
}

// inputLen is the size of the work's input: the facts' when it was not
// read.
func (j job) inputLen() int {
	if j.facts != nil {
		return j.facts.InputBytes
	}
	return len(j.w.Input)
}

// expect is what the claim expects of the row: nil for work read from it.
func (j job) expect() *store.Expect {
	if j.facts == nil {
		return nil
	}
	e := store.ExpectOf(j.w, j.budgeted)
	e.InputBytes = j.facts.InputBytes
	return e
}

// onFacts is the work as its announcement's facts give it, when they
// suffice to go on to a claim: an interactive item with no repair note, of
// a contract this worker knows, a tenant whose budget is known, and nothing
// to decide but to run it. ok=false: read the row.
func (s *Service) onFacts(ctx context.Context, ev event.Work, d consumer.Delivery, need time.Duration) (job, bool) {
	f, has := event.ParseFacts(d.Headers().Get(event.FactsHeader))
	if !has || ev.Lane != event.Interactive || f.Repairs > 0 {
		return job{}, false
	}
	budgeted, known := s.budgets.known(ev.TenantID)
	if !known {
		return job{}, false
	}
	w := &store.Work{ID: ev.WorkID, TenantID: ev.TenantID, Region: ev.Region, Lane: ev.Lane, State: outcome.Queued,
		Contract: f.Contract, SchemaVersion: f.SchemaVersion, TaxonomyVersion: f.TaxonomyVersion,
		PromptDigest: f.PromptDigest, Model: f.Model, Attempts: f.Attempts, OutageAttempts: f.OutageAttempts,
		OutputCap: f.OutputCap, DeadlineAt: f.DeadlineAt, UpdatedAt: f.ReadyAt}
	c, known, err := s.contractOf(ctx, w)
	if err != nil || !known {
		return job{}, false
	}
	if !admit(ev, w, time.Now(), need, s.cfg.MaxAttempts, true).proceed {
		return job{}, false
	}
	return job{w: w, budgeted: budgeted, c: c, facts: &f}, true
}
