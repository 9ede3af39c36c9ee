package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/price"
)

// quiesce waits until both cells are still: every acknowledged work item
// has an outcome, no outbox row is pending, no attempt is open, every
// attempt has its ledger row, and nothing has moved for a while.
func (h *Harness) quiesce(ctx context.Context, acked []string) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(h.o.Quiesce)
	var last string
	stableSince := time.Now()
	for {
		var open, pending, unfinished, attempts, ledger int64
		for _, region := range config.DefaultRegions {
			var o, p, u, a, l int64
			err := h.pool[region].QueryRow(ctx, `SELECT
					(SELECT count(*) FROM work WHERE state IN ('queued', 'running')),
					(SELECT count(*) FROM outbox_waiting WHERE set_aside_at IS NULL),
					(SELECT count(*) FROM attempts WHERE outcome IS NULL),
					(SELECT count(*) FROM attempts WHERE part IS DISTINCT FROM '*'),
					(SELECT count(*) FROM ledger)`).Scan(&o, &p, &u, &a, &l)
			if err != nil {
				// Postgres may be restarting; a still cell is one that answers.
				o = -1
			}
			open, pending, unfinished, attempts, ledger = open+o, pending+p, unfinished+u, attempts+a, ledger+l
		}
		state := fmt.Sprintf("open work %d, pending outbox %d, open attempts %d, attempts %d, ledger rows %d, provider calls %d",
			open, pending, unfinished, attempts, ledger, h.sim.Stats().Total)
		if state != last {
			last, stableSince = state, time.Now()
			h.logf("settling: %s", state)
		}
		still := open == 0 && pending == 0 && unfinished == 0 && attempts == ledger
		if still && time.Since(stableSince) >= h.o.Settle {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("not quiescent after %s: %s", h.o.Quiesce, state)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// check is one invariant's verdict.
type check struct {
	N      string // "1", "2", …
	What   string
	Figure string
	OK     bool
	// Offenders are up to a few ids that break it, for diagnosis.
	Offenders []string
}

// workRow is what the checks read of one work item.
type workRow struct {
	ID, Tenant, Region, State string
	Contract, SourceID        string
	Results                   int
	Attempts                  int
	Ledger                    int
	Estimated                 int
	// Dead are estimated rows of attempts whose worker died after its
	// claim: the call may or may not have left, and the ledger charges it
	// either way (it never under-counts).
	Dead                 int
	BadTenant            int // attempts, ledger rows or results naming another tenant
	RetryAttempts        int // attempts that ended in a way that forces another call
	CreatedAt, UpdatedAt time.Time
}

func (h *Harness) readWork(ctx context.Context) (map[string]*workRow, error) {
	out := map[string]*workRow{}
	for _, region := range config.DefaultRegions {
		// Each table is read once and counted by work (per-row subqueries
		// scanned the ledger, which has no index by work, once per item:
		// hours at 100,000 items).
		rows, err := h.pool[region].Query(ctx, `WITH r AS (SELECT r.work_id, count(*) AS n,
					count(*) FILTER (WHERE r.tenant_id IS DISTINCT FROM w.tenant_id) AS bad
				FROM results r LEFT JOIN work w ON w.id = r.work_id GROUP BY r.work_id),
			a AS (SELECT a.work_id, count(*) FILTER (WHERE a.part IS DISTINCT FROM '*') AS n,
					count(*) FILTER (WHERE a.tenant_id IS DISTINCT FROM w.tenant_id) AS bad,
					count(*) FILTER (WHERE a.outcome IN ('invalid_output', 'rate_limited', 'timeout', 'transport_error',
						'lease_expired', 'stale_lease', 'canceled') AND a.part IS DISTINCT FROM '*') AS retry
				FROM attempts a LEFT JOIN work w ON w.id = a.work_id GROUP BY a.work_id),
			l AS (SELECT l.work_id, count(*) AS n, count(*) FILTER (WHERE l.estimated) AS est,
					count(*) FILTER (WHERE l.estimated AND l.outcome = 'lease_expired') AS dead,
					count(*) FILTER (WHERE l.tenant_id IS DISTINCT FROM w.tenant_id) AS bad
				FROM ledger l LEFT JOIN work w ON w.id = l.work_id GROUP BY l.work_id)
			SELECT w.id, w.tenant_id, w.region, w.state, w.contract, w.source_id, w.created_at, w.updated_at,
				coalesce(r.n, 0), coalesce(a.n, 0), coalesce(l.n, 0), coalesce(l.est, 0), coalesce(l.dead, 0),
				coalesce(a.bad, 0) + coalesce(l.bad, 0) + coalesce(r.bad, 0), coalesce(a.retry, 0)
			FROM work w LEFT JOIN r ON r.work_id = w.id LEFT JOIN a ON a.work_id = w.id LEFT JOIN l ON l.work_id = w.id`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var w workRow
			if err := rows.Scan(&w.ID, &w.Tenant, &w.Region, &w.State, &w.Contract, &w.SourceID, &w.CreatedAt, &w.UpdatedAt, &w.Results, &w.Attempts,
				&w.Ledger, &w.Estimated, &w.Dead, &w.BadTenant, &w.RetryAttempts); err != nil {
				rows.Close()
				return nil, err
			}
			out[w.ID] = &w
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ledgerRows is check 3: ledger rows per tenant (and per work item) equal
// the provider's calls, but for attempts whose worker died between its
// claim and its call: those are charged an estimate though no call left,
// so rows may exceed calls by the dead attempts' rows, never more, and
// never fall short.
func (h *Harness) ledgerRows(works map[string]*workRow, stats sim.Stats, calls map[string]int) check {
	ledgerByTenant, deadByTenant := map[string]int{}, map[string]int{}
	estimated, dead := 0, 0
	for _, w := range works {
		ledgerByTenant[w.Tenant] += w.Ledger
		deadByTenant[w.Tenant] += w.Dead
		estimated += w.Estimated
		dead += w.Dead
	}
	var per []string
	ok3 := true
	var totalCalls, totalLedger int64
	for _, t := range h.tenants {
		calls := stats.Tenants[t.ID].Calls
		l := int64(ledgerByTenant[t.ID])
		totalCalls, totalLedger = totalCalls+calls, totalLedger+l
		switch {
		case l == calls:
			per = append(per, fmt.Sprintf("%s %d=%d", t.ID, l, calls))
		case l > calls && l-calls <= int64(deadByTenant[t.ID]):
			per = append(per, fmt.Sprintf("%s %d=%d+%d dead", t.ID, l, calls, l-calls))
		default:
			ok3 = false
			per = append(per, fmt.Sprintf("%s %d≠%d", t.ID, l, calls))
		}
	}
	for k, v := range stats.Tenants {
		if !slices.ContainsFunc(h.tenants, func(t tenant) bool { return t.ID == k }) {
			ok3 = false
			per = append(per, fmt.Sprintf("%s (unknown tenant) 0≠%d", k, v.Calls))
		}
	}
	var bad3 []string
	unused := 0
	for id, w := range works {
		switch over := w.Ledger - calls[id]; {
		case over == 0:
		case over > 0 && over <= w.Dead:
			unused += over
		default:
			bad3 = append(bad3, fmt.Sprintf("%s: provider %d calls, ledger %d rows (%d estimated, %d of dead workers), attempts %d",
				id, calls[id], w.Ledger, w.Estimated, w.Dead, w.Attempts))
		}
	}
	sort.Strings(bad3)
	return check{N: "3", What: "ledger attempt rows per tenant == provider calls per tenant (exact, but for workers killed between claim and call)",
		Figure: fmt.Sprintf("ledger %d, provider %d (%d rows estimated: no usage came back, a worker died or the body was cut; %d of workers that died after their claim, %d of which made no call); %s; %d work items differ",
			totalLedger, totalCalls, estimated, dead, unused, strings.Join(per, ", "), len(bad3)),
		OK: ok3 && len(bad3) == 0, Offenders: bad3}
}

// retryAfterCheck is invariant r: no Retry-After ingress answered is
// longer than the work could wait (its lane's default deadline; the
// harness sets none of its own).
func retryAfterCheck(st *loadStats) check {
	deadline := map[string]time.Duration{"interactive": 10 * time.Minute, "batch": 24 * time.Hour}
	st.mu.Lock()
	defer st.mu.Unlock()
	ok := true
	var parts, bad []string
	for _, lane := range []string{"interactive", "batch"} {
		d := st.longestRetry[lane]
		parts = append(parts, fmt.Sprintf("%s %s (deadline %s)", lane, d.Round(time.Second), deadline[lane]))
		if d > deadline[lane] {
			ok = false
			bad = append(bad, fmt.Sprintf("%s: Retry-After %s, longer than the %s its work could wait", lane, d.Round(time.Second), deadline[lane]))
		}
	}
	return check{N: "r", What: "no Retry-After longer than the work could wait (its lane's deadline)",
		Figure: "longest: " + strings.Join(parts, ", "), OK: ok, Offenders: bad}
}

// evaluate checks invariants 1 to 6 (and the budget's reservations).
func (h *Harness) evaluate(ctx context.Context, subs []*submission, sched []*faultRecord) ([]check, []recovery, error) {
	works, err := h.readWork(ctx)
	if err != nil {
		return nil, nil, err
	}
	var checks []check
	add := func(c check) {
		if len(c.Offenders) > 5 {
			c.Offenders = c.Offenders[:5]
		}
		checks = append(checks, c)
	}
	add(ackedCheck(subs, works))
	add(resultsCheck(works))
	stats, calls := h.sim.Stats(), h.front.calls()
	add(h.ledgerRows(works, stats, calls))
	c, err := h.ledgerCost(ctx, stats)
	if err != nil {
		return nil, nil, err
	}
	add(c)
	if c, err = h.tenantCheck(ctx, works); err != nil {
		return nil, nil, err
	}
	add(c)
	add(h.duplicateCheck(subs, works, calls))
	recs := h.recoveries(works, sched)
	add(recoveryCheck(recs))
	if c, err = h.budgetCheck(ctx); err != nil {
		return nil, nil, err
	}
	add(c)
	if c, err = h.publications(ctx, works); err != nil {
		return nil, nil, err
	}
	add(c)
	if h.cl != nil {
		c, fig := h.strandCheck(sched)
		add(c)
		for i := range recs {
			for _, d := range fig.perFault[recs[i].Fault] {
				recs[i].Stranded++
				recs[i].SlowestStrand = max(recs[i].SlowestStrand, d)
			}
		}
		add(h.failoverCheck(works, subs, sched))
	}
	return checks, recs, nil
}

// ackedCheck is check 1: every acknowledged work id reached exactly one
// terminal outcome.
func ackedCheck(subs []*submission, works map[string]*workRow) check {
	acked := map[string]bool{}
	var notAcked []string
	for _, s := range subs {
		if !s.Acked {
			notAcked = append(notAcked, fmt.Sprintf("%s %s: %s", s.Tenant.ID, s.SourceID, strings.Join(s.Errors, "; ")))
		}
		for id := range s.WorkIDs {
			acked[id] = true
		}
	}
	outcomes := map[string]int{}
	var missing, open []string
	for id := range acked {
		w, ok := works[id]
		switch {
		case !ok:
			missing = append(missing, id)
		case !outcome.IsTerminal(w.State):
			open = append(open, id+" "+w.State)
		default:
			outcomes[w.State]++
		}
	}
	var oc []string
	for k, v := range outcomes {
		oc = append(oc, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(oc)
	return check{N: "1", What: "every acknowledged work id reached exactly one terminal outcome",
		Figure: fmt.Sprintf("%d acknowledged, %d terminal (%s), %d lost, %d unfinished; %d keys never acknowledged",
			len(acked), len(acked)-len(missing)-len(open), strings.Join(oc, ", "), len(missing), len(open), len(notAcked)),
		OK: len(missing) == 0 && len(open) == 0, Offenders: append(append(missing, open...), notAcked...)}
}

// resultsCheck is check 2: accepted => exactly one result; no result for
// anything else.
func resultsCheck(works map[string]*workRow) check {
	var accepted, noResult, extra int
	var bad2 []string
	for _, w := range works {
		if w.State == outcome.Accepted {
			accepted++
			if w.Results != 1 {
				noResult++
				bad2 = append(bad2, fmt.Sprintf("%s accepted with %d results", w.ID, w.Results))
			}
		} else if w.Results > 0 {
			extra++
			bad2 = append(bad2, fmt.Sprintf("%s %s with %d results", w.ID, w.State, w.Results))
		}
	}
	return check{N: "2", What: "accepted => exactly one result row; no result for any other outcome",
		Figure: fmt.Sprintf("%d accepted, %d without exactly one result, %d results on work not accepted", accepted, noResult, extra),
		OK:     noResult == 0 && extra == 0, Offenders: bad2}
}

// ledgerCost is check 3b: the ledger never under-counts cost: per tenant,
// what it charged is at least the price of the units the provider billed
// (answers whose usage a client could not read, and calls that never
// answered, are charged their estimate).
func (h *Harness) ledgerCost(ctx context.Context, stats sim.Stats) (check, error) {
	var per3b []string
	ok3b := true
	for _, t := range h.tenants {
		st := stats.Tenants[t.ID]
		billed := price.Default.CostMicros(chaosModel, st.PromptUnits, st.CompletionUnits)
		var charged int64
		for _, region := range config.DefaultRegions {
			var c int64
			if err := h.pool[region].QueryRow(ctx, `SELECT coalesce(sum(cost_micros), 0) FROM ledger WHERE tenant_id = $1`,
				t.ID).Scan(&c); err != nil {
				return check{}, err
			}
			charged += c
		}
		// Each ledger row is rounded to a micro-dollar on its own: allow
		// half of one per call.
		mark := "≥"
		if charged < billed-(st.Calls+1)/2 {
			mark, ok3b = "<", false
		}
		per3b = append(per3b, fmt.Sprintf("%s %d%s%d µ$", t.ID, charged, mark, billed))
	}
	return check{N: "3b", What: "ledger cost per tenant >= the price of the units the provider billed, to the rounding of each row (never under-counts)",
		Figure: strings.Join(per3b, ", "), OK: ok3b}, nil
}

// tenantCheck is check 4: every attempt has a tenant, and it is its
// work's.
func (h *Harness) tenantCheck(ctx context.Context, works map[string]*workRow) (check, error) {
	var noTenant, crossTenant int
	for _, region := range config.DefaultRegions {
		var a, b int
		if err := h.pool[region].QueryRow(ctx, `SELECT
				(SELECT count(*) FROM attempts WHERE tenant_id IS NULL OR tenant_id = ''),
				(SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id WHERE a.tenant_id <> w.tenant_id)
				+ (SELECT count(*) FROM ledger l JOIN work w ON w.id = l.work_id WHERE l.tenant_id <> w.tenant_id)
				+ (SELECT count(*) FROM results r JOIN work w ON w.id = r.work_id WHERE r.tenant_id <> w.tenant_id)`).
			Scan(&a, &b); err != nil {
			return check{}, err
		}
		noTenant, crossTenant = noTenant+a, crossTenant+b
	}
	var attemptsTotal int
	for _, w := range works {
		attemptsTotal += w.Attempts
	}
	return check{N: "4", What: "no attempt without a tenant; every attempt's (ledger row's, result's) tenant == its work's",
		Figure: fmt.Sprintf("%d attempts, %d without a tenant, %d rows naming another tenant", attemptsTotal, noTenant, crossTenant),
		OK:     noTenant == 0 && crossTenant == 0}, nil
}

// duplicateCheck is check 5: a key delivered DupTimes at once costs one
// call, unless a fault forced a retry, and then every extra call is an
// attempt.
func (h *Harness) duplicateCheck(subs []*submission, works map[string]*workRow, calls map[string]int) check {
	var keys, oneID, oneCall, retried, unexplained, deliveries int
	var bad5 []string
	for _, s := range subs {
		if s.Times < 2 {
			continue
		}
		keys++
		for _, n := range s.WorkIDs {
			deliveries += n
		}
		if len(s.WorkIDs) != 1 || s.Created > 1 {
			bad5 = append(bad5, fmt.Sprintf("%s %s: %d work ids, %d created", s.Tenant.ID, s.SourceID, len(s.WorkIDs), s.Created))
			unexplained++
			continue
		}
		oneID++
		var id string
		for k := range s.WorkIDs {
			id = k
		}
		w := works[id]
		c := calls[id]
		switch {
		case w == nil:
			unexplained++
			bad5 = append(bad5, id+": no work row")
		case c == 1 && w.Attempts == 1 && w.Results <= 1:
			oneCall++
		case c > 1 && c == w.Ledger && w.Attempts == c && w.Results <= 1:
			// Every extra call is an attempt with its ledger row. (An
			// attempt may say ok and still not be the result: its ATTEMPT
			// event was lost with the broker's store and the work was
			// answered again.)
			retried++
		case c >= 1 && w.Attempts == w.Ledger && w.Attempts > c && w.Attempts-c <= w.Dead && w.Results <= 1:
			// A worker killed between its claim and its call left an
			// attempt that made no call; it is charged an estimate.
			retried++
		default:
			unexplained++
			bad5 = append(bad5, fmt.Sprintf("%s: %d calls, %d attempts (%d ended forcing a retry), %d ledger rows, %d results",
				id, c, w.Attempts, w.RetryAttempts, w.Ledger, w.Results))
		}
	}
	return check{N: "5", What: fmt.Sprintf("a key delivered %d× at once: one work id, one model call unless a fault forced a retry, every extra call an attempt", h.o.DupTimes),
		Figure: fmt.Sprintf("%d keys (%d deliveries acknowledged), %d with one work id; %d cost one call, %d retried by a fault (extra calls all attempts), %d unexplained",
			keys, deliveries, oneID, oneCall, retried, unexplained),
		OK: unexplained == 0, Offenders: bad5}
}

// recoveryCheck is check 6: throughput after each fault returns to 95% of
// the pre-fault rate within 30s.
func recoveryCheck(recs []recovery) check {
	ok6 := true
	var worst time.Duration
	measured := 0
	var bad6 []string
	for _, r := range recs {
		if r.NA != "" {
			continue
		}
		measured++
		if !r.Recovered || r.After > 30*time.Second {
			ok6 = false
			bad6 = append(bad6, r.Fault.label())
		}
		worst = max(worst, r.After)
	}
	return check{N: "6", What: "throughput after each fault back to >= 95% of the pre-fault rate within 30s",
		Figure: fmt.Sprintf("%d faults measured, slowest recovery %s; %d not recovered in 30s", measured, worst.Round(100*time.Millisecond), len(bad6)),
		OK:     ok6, Offenders: bad6}
}

// budgetCheck is check b: every budget reservation settled or released.
func (h *Harness) budgetCheck(ctx context.Context) (check, error) {
	var open7, heldMicros int64
	for _, region := range config.DefaultRegions {
		var n, m int64
		if err := h.pool[region].QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_micros), 0)
			FROM budget_reservations WHERE settled_at IS NULL`).Scan(&n, &m); err != nil {
			return check{}, err
		}
		var reserved int64
		if err := h.pool[region].QueryRow(ctx, `SELECT coalesce(sum(reserved_micros), 0) FROM budget_periods`).Scan(&reserved); err != nil {
			return check{}, err
		}
		open7, heldMicros = open7+n, heldMicros+reserved
	}
	return check{N: "b", What: "budgets: no reservation left held once everything settled",
		Figure: fmt.Sprintf("%d reservations unsettled, %d micro-dollars still reserved", open7, heldMicros),
		OK:     open7 == 0 && heldMicros == 0}, nil
}

// recovery is how throughput came back after one fault.
type recovery struct {
	Fault     *faultRecord
	Scope     string
	Before    float64 // items/s finished in the window before the fault
	Recovered bool
	After     time.Duration // from the fault until a window reached 95% of Before
	NA        string
	// Held is how many work items the fault left to a lease or the
	// sweeper, Finished how many of them reached an outcome, Last when the
	// last did, after the fault.
	Held, Finished int
	Last           time.Duration
	// Stranded is how many items this fault stranded (cluster mode), and
	// SlowestStrand how long after its end the last was back in flight.
	Stranded      int
	SlowestStrand time.Duration
}

const (
	rateBefore = 20 * time.Second
	rateWindow = 5 * time.Second
)

// recoveries measures, per fault, work finished per second in its scope
// (its region, or both cells) before the fault, and how long after it a
// rateWindow-long window first finished at least 95% as much. The rate
// before a fault is what the cell sustained: work finished in the window,
// but no more than arrived in it. More than arrived is the backlog of an
// earlier fault being drained, a rate no cell keeps up once it is drained.
func (h *Harness) recoveries(works map[string]*workRow, sched []*faultRecord) []recovery {
	tl := newTimeline(works)
	var out []recovery
	for _, f := range sched {
		out = append(out, h.recoveryOf(f, works, tl, sched))
	}
	return out
}

// timeline is when work arrived and when it reached its outcome, in both
// cells and per cell, each sorted.
type timeline struct {
	all, allIn           []time.Time
	byRegion, inByRegion map[string][]time.Time
}

// newTimeline sorts the works' creation and outcome times.
func newTimeline(works map[string]*workRow) timeline {
	tl := timeline{byRegion: map[string][]time.Time{}, inByRegion: map[string][]time.Time{}}
	for _, w := range works {
		tl.allIn = append(tl.allIn, w.CreatedAt)
		tl.inByRegion[w.Region] = append(tl.inByRegion[w.Region], w.CreatedAt)
		if !outcome.IsTerminal(w.State) {
			continue
		}
		tl.all = append(tl.all, w.UpdatedAt)
		tl.byRegion[w.Region] = append(tl.byRegion[w.Region], w.UpdatedAt)
	}
	sortTimes := func(ts []time.Time) { sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) }) }
	sortTimes(tl.all)
	sortTimes(tl.allIn)
	for _, m := range []map[string][]time.Time{tl.byRegion, tl.inByRegion} {
		for _, ts := range m {
			sortTimes(ts)
		}
	}
	return tl
}

// countBetween is how many of the sorted times ts fall in [from, to).
func countBetween(ts []time.Time, from, to time.Time) int {
	i := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(from) })
	j := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(to) })
	return j - i
}

// recoveryOf measures how throughput in f's scope came back after f.
func (h *Harness) recoveryOf(f *faultRecord, works map[string]*workRow, tl timeline, sched []*faultRecord) recovery {
	r := recovery{Fault: f, Scope: "both cells", Held: len(f.Lost)}
	for _, id := range f.Lost {
		if w := works[id]; w != nil && outcome.IsTerminal(w.State) {
			r.Finished++
			r.Last = max(r.Last, w.UpdatedAt.Sub(f.Fired))
		}
	}
	ts, in := tl.all, tl.allIn
	if f.Region != "" {
		r.Scope, ts, in = "cell "+f.Region, tl.byRegion[f.Region], tl.inByRegion[f.Region]
	}
	if f.Fired.IsZero() || f.Skip != "" || f.Err != nil {
		r.NA = "did not run"
		return r
	}
	r.Before = float64(min(countBetween(ts, f.Fired.Add(-rateBefore), f.Fired), countBetween(in, f.Fired.Add(-rateBefore), f.Fired))) / rateBefore.Seconds()
	if r.Before*rateBefore.Seconds() < 10 {
		r.NA = "too little finished before it to measure"
		return r
	}
	// The load ends in a cell with the last work it was given: the
	// run's load can go on after that with retries to the other cell.
	loadEnd := h.loadEnd
	if len(in) > 0 && in[len(in)-1].Before(loadEnd) {
		loadEnd = in[len(in)-1]
	}
	if f.end().Add(30 * time.Second).After(loadEnd) {
		r.NA = "load ended within 30s of it"
		return r
	}
	target := 0.95 * r.Before
	var next time.Time
	if h.cl != nil {
		// The cluster mode's faults last, and a run may hold many:
		// a window the next one reaches measures that one too.
		next = nextInScope(sched, f)
	}
	for k := time.Duration(0); k <= 60*time.Second; k += 250 * time.Millisecond {
		from := f.end().Add(k)
		if from.Add(rateWindow).After(loadEnd) {
			break
		}
		if !next.IsZero() && from.Add(rateWindow).After(next) {
			r.NA = "the next fault in its scope came before it recovered"
			break
		}
		if float64(countBetween(ts, from, from.Add(rateWindow)))/rateWindow.Seconds() >= target {
			r.Recovered, r.After = true, k+rateWindow
			break
		}
	}
	return r
}

// nextInScope is when the next fault after f that touches f's cells
// fired, zero when none did.
func nextInScope(sched []*faultRecord, f *faultRecord) time.Time {
	var next time.Time
	for _, g := range sched {
		if g == f || g.Fired.IsZero() || !g.Fired.After(f.Fired) {
			continue
		}
		if f.Region != "" && g.Region != "" && g.Region != f.Region {
			continue
		}
		if next.IsZero() || g.Fired.Before(next) {
			next = g.Fired
		}
	}
	return next
}

// report prints the invariant table, the faults and the recoveries.
func (h *Harness) report(w io.Writer, checks []check, recs []recovery, subs []*submission, st *loadStats, quiet time.Duration) bool {
	ok := true
	fmt.Fprintf(w, "\n== chaos seed %d: %d keys (%d delivered %d× at once) over %s, %d tenants in %s\n",
		h.o.Seed, len(subs), countDup(subs), h.o.DupTimes, h.o.Load, len(h.tenants), strings.Join(config.DefaultRegions, "+"))
	fmt.Fprintf(w, "   ingress requests %d (retries %d: %d unavailable, %d throttled, %d network errors); quiescent %s after the load\n\n",
		st.requests.Load(), st.retries.Load(), st.unavailable.Load(), st.throttled.Load(), st.netErrors.Load(), quiet.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tinvariant\tverdict\tfigure")
	for _, c := range checks {
		v := "ok"
		if !c.OK {
			v, ok = "VIOLATED", false
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.N, c.What, v, c.Figure)
	}
	tw.Flush()
	for _, c := range checks {
		if !c.OK && len(c.Offenders) > 0 {
			fmt.Fprintf(w, "\n   invariant %s, first offenders:\n", c.N)
			for _, o := range c.Offenders {
				fmt.Fprintf(w, "     %s\n", o)
			}
		}
	}
	fmt.Fprintf(w, "\n   faults (seed %d):\n", h.o.Seed)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   at\tfault\tscope\tlasted\trate before\trecovered after\tstranded work done\tstranded, back in flight after its end\twhat happened")
	for _, r := range recs {
		f := r.Fault
		rec := "n/a: " + r.NA
		switch {
		case r.NA != "":
		case r.Recovered:
			rec = r.After.Round(100 * time.Millisecond).String()
			if f.Lasting {
				rec += " from its end"
			}
		default:
			rec = "NOT within 60s"
		}
		what := f.Note
		if f.Skip != "" {
			what = "skipped: " + f.Skip
		}
		if f.Err != nil {
			what = "failed: " + f.Err.Error()
		}
		held := "-"
		if r.Held > 0 {
			held = fmt.Sprintf("%d/%d after %s", r.Finished, r.Held, r.Last.Round(time.Second))
		}
		strand := "-"
		if r.Stranded > 0 {
			strand = fmt.Sprintf("%d, slowest %s", r.Stranded, r.SlowestStrand.Round(100*time.Millisecond))
		}
		lasted := "-"
		if !f.Fired.IsZero() && !f.Done.IsZero() {
			lasted = f.Done.Sub(f.Fired).Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\t%.1f/s\t%s\t%s\t%s\t%s\n", f.At.Round(time.Second), f.Kind, r.Scope, lasted, r.Before, rec, held, strand, what)
	}
	tw.Flush()
	kills := 0
	for _, p := range h.procs {
		kills += p.kills
	}
	fmt.Fprintf(w, "\n   SIGKILLs of services %d, of nats-server %d; provider calls %d\n", kills, h.natsKills(), h.sim.Stats().Total)
	for _, n := range h.notes {
		fmt.Fprintf(w, "   note: %s\n", n)
	}
	verdict := "all invariants hold"
	if !ok {
		verdict = "INVARIANTS VIOLATED"
	}
	fmt.Fprintf(w, "\n== %s (seed %d; repeat with -seed %d)\n", verdict, h.o.Seed, h.o.Seed)
	return ok
}

// natsKills counts the SIGKILLs of nats-server, of every node in the
// cluster mode.
func (h *Harness) natsKills() int {
	if h.cl == nil {
		return h.nats.kills
	}
	n := 0
	for _, c := range h.cl.cells {
		for _, node := range c.nats {
			n += node.proc.kills
		}
	}
	return n
}

func countDup(subs []*submission) int {
	n := 0
	for _, s := range subs {
		if s.Times > 1 {
			n++
		}
	}
	return n
}
