package ledger

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// storeFacts puts into one implementation of Store what the rest of the
// cell writes and the ledger only reads. Ages count back from now.
type storeFacts interface {
	// Tenant adds a tenant homed in home whose API token is token, with a
	// budget no reservation of the suite exhausts.
	Tenant(id, home, token string)
	// Suspend suspends a tenant.
	Suspend(tenant string)
	// Reserve holds amount of the tenant's budget for an attempt, as the
	// classifier does before its claim; age is the reservation's.
	Reserve(tenant, attempt string, amount int64, age time.Duration)
	// Claim takes the lease of work for an attempt, creating the work when
	// new, as the classifier does before its model call. An earlier
	// attempt of the work still without an outcome becomes lease_expired.
	Claim(c claimFact)
	// Report ends a claimed attempt with result and writes its events to
	// the outbox, each with the attempt id as its message id, as the
	// classifier does when the call returns.
	Report(attempt, result string, events ...eventFact)
	// Down makes the store stop answering.
	Down()
}

// claimFact is one claim of work by an attempt.
type claimFact struct {
	Tenant, Work, Attempt string
	// Age is how long ago the attempt started.
	Age time.Duration
	// Lease is how long the lease has left; negative, how long ago it ran
	// out.
	Lease time.Duration
	// Estimate is what the attempt's call may cost at most.
	Estimate int64
}

// eventFact is one event of an attempt in the outbox, or kept on the
// attempt's row.
type eventFact struct {
	Stream  string
	Payload []byte
	// NoCall: the event of an attempt that made no call of its own
	// (event.NoCallHeader).
	NoCall bool
	// Written is the outbox row's age, Published its publication's;
	// a negative Published: not published yet.
	Written, Published time.Duration
	// OnRow: an ATTEMPT event kept on the attempt's row, with no outbox
	// row, recorded Written ago; it counts as published then.
	OnRow bool
}

// attemptN is the attempt id numbered n.
func attemptN(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }

// leaseToken is the lease token an attempt claims with.
func leaseToken(attempt string) string { return "00000000-0000-4000-9000-" + attempt[24:] }

// startedAbout reports whether at is age ago, give or take the half
// minute a slow test and two clocks may put between them.
func startedAbout(at time.Time, age time.Duration) bool {
	d := time.Since(at)
	return d > age-30*time.Second && d < age+30*time.Second
}

// TestStoreConformance holds *store.Store and memStore, on which the
// ledger's decision tests run, to the one behaviour the ledger relies on.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		storeSuite(t, openPostgresStore)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		storeSuite(t, func(t *testing.T) (Store, storeFacts) {
			m := newMemStore(t)
			return m, m
		})
	})
}

// storeSuite checks what the ledger relies on of its Store. open makes, for
// each case, an empty store of the implementation under test and the means
// to put facts into it.
func storeSuite(t *testing.T, open func(t *testing.T) (Store, storeFacts)) {
	// day is the day the suite's ledger rows occurred on, whole seconds so
	// that the database's microseconds keep them exactly.
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	row := func(attempt int, tenant, work string, cost int64) store.LedgerRow {
		return store.LedgerRow{AttemptID: attemptN(attempt), TenantID: tenant, WorkID: work, Model: "assay-sim-1",
			Outcome: outcome.AttemptOK, UpstreamAttempts: 1, InputUnits: 100, OutputUnits: 10, CostMicros: cost,
			OccurredAt: day.Add(time.Hour)}
	}
	record := func(t *testing.T, st Store, rows ...store.LedgerRow) []store.LedgerResult {
		t.Helper()
		got := st.RecordLedgerBatch(t.Context(), rows)
		if len(got) != len(rows) {
			t.Fatalf("%d results for %d rows", len(got), len(rows))
		}
		return got
	}
	// given records rows a case starts from, each of which must be new.
	given := func(t *testing.T, st Store, rows ...store.LedgerRow) {
		t.Helper()
		for i, r := range record(t, st, rows...) {
			if r != (store.LedgerResult{Recorded: store.Inserted}) {
				t.Fatalf("given row %d: %+v, want it inserted", i, r)
			}
		}
	}
	usage := func(t *testing.T, st Store, tenant, by string) []store.UsageLine {
		t.Helper()
		lines, err := st.Usage(t.Context(), tenant, day, day.Add(24*time.Hour), by)
		if err != nil {
			t.Fatal(err)
		}
		return lines
	}
	const grace, horizon = time.Minute, time.Hour
	run := func(name string, f func(t *testing.T, st Store, facts storeFacts)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, facts := open(t)
			f(t, st, facts)
		})
	}

	// A redelivered attempt changes nothing, in a batch or alone: the
	// first row stands, and only a new row settles its reservation, telling
	// what it cost beyond it.
	run("RecordsAnAttemptOnce", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Reserve("acme", attemptN(1), 5000, 0)
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		got := record(t, st, row(1, "acme", "w1", 7000), row(2, "acme", "w1", 100), row(1, "acme", "w1", 1))
		want := []store.LedgerResult{{Recorded: store.Inserted, Excess: 2000}, {Recorded: store.Inserted}, {Recorded: store.Duplicate}}
		if !slices.Equal(got, want) {
			t.Errorf("batch: %+v, want %+v", got, want)
		}
		if got := record(t, st, row(1, "acme", "w1", 9)); got[0] != (store.LedgerResult{Recorded: store.Duplicate}) {
			t.Errorf("redelivery alone: %+v, want a duplicate", got[0])
		}
		want2 := []store.UsageLine{{Key: outcome.AttemptOK, Calls: 2, InputUnits: 200, OutputUnits: 20, CostMicros: 7100}}
		if got := usage(t, st, "acme", store.ByOutcome); !slices.Equal(got, want2) {
			t.Errorf("usage %+v, want %+v", got, want2)
		}
	})

	// The estimate the reaper writes for a dead worker's attempt gives way
	// to the attempt's own report, once; nothing replaces a report.
	run("ReplacesAnEstimateWithItsReport", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Reserve("acme", attemptN(1), 5000, 0)
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		estimate := row(1, "acme", "w1", 5000)
		estimate.Model, estimate.Outcome, estimate.InputUnits, estimate.OutputUnits, estimate.Estimated =
			"unknown", outcome.AttemptLeaseExpired, 0, 0, true
		report := row(1, "acme", "w1", 300)
		report.Outcome, report.InputUnits, report.OutputUnits = outcome.AttemptStaleLease, 800, 80
		costlier := estimate
		costlier.CostMicros = 6000
		again := report
		again.CostMicros = 999
		for i, step := range []struct {
			row  store.LedgerRow
			want store.Recorded
		}{
			{estimate, store.Inserted}, {costlier, store.Duplicate}, {report, store.Replaced},
			{again, store.Duplicate}, {estimate, store.Duplicate},
		} {
			if got := record(t, st, step.row); got[0] != (store.LedgerResult{Recorded: step.want}) {
				t.Errorf("step %d: %+v, want %v and no excess", i, got[0], step.want)
			}
		}
		want := []store.UsageLine{{Key: outcome.AttemptStaleLease, Calls: 1, InputUnits: 800, OutputUnits: 80, CostMicros: 300}}
		if got := usage(t, st, "acme", store.ByOutcome); !slices.Equal(got, want) {
			t.Errorf("usage %+v, want the report alone %+v", got, want)
		}
	})

	// A row keeps its cached input and reasoning units, written alone, in
	// a batch, or replacing an estimate, and usage sums them.
	run("KeepsCachedAndReasoningUnits", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		estimate := row(1, "acme", "w1", 5000)
		estimate.Outcome, estimate.InputUnits, estimate.OutputUnits, estimate.Estimated = outcome.AttemptLeaseExpired, 0, 0, true
		given(t, st, estimate)
		report := row(1, "acme", "w1", 40)
		report.CachedInputUnits, report.ReasoningUnits = 64, 4
		second, third := row(2, "acme", "w1", 50), row(3, "acme", "w1", 60)
		second.CachedInputUnits, third.ReasoningUnits = 32, 8
		got := record(t, st, report, second, third)
		want := []store.LedgerResult{{Recorded: store.Replaced}, {Recorded: store.Inserted}, {Recorded: store.Inserted}}
		if !slices.Equal(got, want) {
			t.Errorf("batch: %+v, want %+v", got, want)
		}
		wantLines := []store.UsageLine{{Key: "assay-sim-1", Calls: 3, InputUnits: 300, OutputUnits: 30,
			CachedInputUnits: 96, ReasoningUnits: 12, CostMicros: 150}}
		if got := usage(t, st, "acme", store.ByModel); !slices.Equal(got, wantLines) {
			t.Errorf("usage %+v, want %+v", got, wantLines)
		}
	})

	// A row whose work is not the cell's, or is another tenant's, is
	// refused for good, alone: its batch is recorded all the same.
	run("RefusesARowOfWorkItDoesNotHold", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Tenant("globex", "us", "tok-globex")
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		got := record(t, st, row(1, "acme", "w1", 10), row(2, "acme", "w_elsewhere", 10), row(3, "globex", "w1", 10),
			row(4, "acme", "w1", 10))
		if got[0] != (store.LedgerResult{Recorded: store.Inserted}) || got[3] != (store.LedgerResult{Recorded: store.Inserted}) {
			t.Errorf("the good rows of the batch: %+v and %+v, want both inserted", got[0], got[3])
		}
		for _, i := range []int{1, 2} {
			if !store.Permanent(got[i].Err) {
				t.Errorf("row %d: %+v, want refused for good", i, got[i])
			}
		}
		if got := record(t, st, row(2, "acme", "w_elsewhere", 10)); !store.Permanent(got[0].Err) {
			t.Errorf("the refused row again: %+v, want refused for good", got[0])
		}
		if got := usage(t, st, "acme", store.ByOutcome); len(got) != 1 || got[0].Calls != 2 {
			t.Errorf("usage %+v, want the two good rows", got)
		}
	})

	// An ATTEMPT event of a call published more than grace ago, written
	// within the horizon, whose attempt has no row, is read back, oldest
	// written first; nothing else is, an attempt that made no call of its
	// own included.
	run("ReadsBackEventsWithoutARow", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		payload := func(n int) []byte { return fmt.Appendf(nil, `{"attempt":%d}`, n) }
		for _, e := range []struct {
			n    int
			fact eventFact
		}{
			{1, eventFact{Stream: event.KindAttempt, Written: 3 * time.Minute, Published: 2 * time.Minute}},
			{2, eventFact{Stream: event.KindAttempt, Written: 10 * time.Second, Published: 10 * time.Second}}, // within grace
			{3, eventFact{Stream: event.KindAttempt, Written: 3 * time.Minute, Published: -1}},                // not published
			{4, eventFact{Stream: event.KindAttempt, Written: 2 * time.Hour, Published: 2 * time.Hour}},       // beyond the horizon
			{5, eventFact{Stream: event.KindResult, Written: 3 * time.Minute, Published: 2 * time.Minute}},    // another stream
			{6, eventFact{Stream: event.KindAttempt, Written: 4 * time.Minute, Published: 2 * time.Minute}},   // recorded below
			{7, eventFact{Stream: event.KindAttempt, Written: 5 * time.Minute, Published: 2 * time.Minute}},
			{8, eventFact{Stream: event.KindAttempt, Written: 6 * time.Minute, Published: 2 * time.Minute, NoCall: true}}, // no call
			{9, eventFact{Stream: event.KindAttempt, Written: 7 * time.Minute, OnRow: true}},
			{10, eventFact{Stream: event.KindAttempt, Written: 10 * time.Second, OnRow: true}},              // within grace
			{11, eventFact{Stream: event.KindAttempt, Written: 8 * time.Minute, OnRow: true, NoCall: true}}, // no call
			{12, eventFact{Stream: event.KindAttempt, Written: 2 * time.Hour, OnRow: true}},                 // beyond the horizon
		} {
			f.Claim(claimFact{Tenant: "acme", Work: fmt.Sprintf("w%d", e.n), Attempt: attemptN(e.n), Age: e.fact.Written, Lease: time.Minute})
			e.fact.Payload = payload(e.n)
			f.Report(attemptN(e.n), outcome.AttemptOK, e.fact)
		}
		given(t, st, row(6, "acme", "w6", 10))
		read := func(limit int) []string {
			t.Helper()
			got, err := st.UnrecordedEvents(t.Context(), event.KindAttempt, grace, horizon, limit)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, p := range got {
				out = append(out, string(p))
			}
			return out
		}
		if got, want := read(10), []string{string(payload(9)), string(payload(7)), string(payload(1))}; !slices.Equal(got, want) {
			t.Errorf("unrecorded events %q, want %q", got, want)
		}
		if got, want := read(1), []string{string(payload(9))}; !slices.Equal(got, want) {
			t.Errorf("unrecorded events, limit 1: %q, want %q", got, want)
		}
		given(t, st, row(7, "acme", "w7", 10), row(9, "acme", "w9", 10))
		if got, want := read(10), []string{string(payload(1))}; !slices.Equal(got, want) {
			t.Errorf("unrecorded events once two are recorded: %q, want %q", got, want)
		}
	})

	// An attempt is dead when it started more than grace ago, its lease is
	// another attempt's or ran out more than grace ago, and it has neither
	// a row nor an event; it is charged the larger of its estimate and its
	// unsettled reservation, and named after the model its work reported.
	run("FindsAttemptsWhoseWorkerDied", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		// 1: lease ran out two minutes ago; it holds a reservation.
		f.Reserve("acme", attemptN(1), 5000, 3*time.Minute)
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Age: 3 * time.Minute, Lease: -2 * time.Minute, Estimate: 700})
		// 10: its estimate is above its reservation.
		f.Reserve("acme", attemptN(10), 300, 4*time.Minute)
		f.Claim(claimFact{Tenant: "acme", Work: "w10", Attempt: attemptN(10), Age: 4 * time.Minute, Lease: -3 * time.Minute, Estimate: 800})
		// 2: its work was claimed again, by 3, which is young; another
		// attempt of the work reported gpt-4o-mini.
		f.Claim(claimFact{Tenant: "acme", Work: "w2", Attempt: attemptN(2), Age: 5 * time.Minute, Lease: -4 * time.Minute, Estimate: 900})
		f.Claim(claimFact{Tenant: "acme", Work: "w2", Attempt: attemptN(3), Age: 10 * time.Second, Lease: time.Minute, Estimate: 900})
		reported := row(9, "acme", "w2", 10)
		reported.Model = "gpt-4o-mini"
		// An estimate names no model of its work.
		guessed := row(8, "acme", "w1", 10)
		guessed.Model, guessed.Estimated = "guessed", true
		given(t, st, reported, guessed)
		// 4: its lease is live. 5: its lease ran out within grace. 6: it
		// reported (its event is not yet published). 7: it has a row. 11:
		// its event, kept on its row, says its lease had expired.
		f.Claim(claimFact{Tenant: "acme", Work: "w4", Attempt: attemptN(4), Age: 3 * time.Minute, Lease: time.Minute})
		f.Claim(claimFact{Tenant: "acme", Work: "w5", Attempt: attemptN(5), Age: 3 * time.Minute, Lease: -10 * time.Second})
		f.Claim(claimFact{Tenant: "acme", Work: "w6", Attempt: attemptN(6), Age: 3 * time.Minute, Lease: -2 * time.Minute})
		f.Report(attemptN(6), outcome.AttemptOK, eventFact{Stream: event.KindAttempt, Payload: []byte("{}"), Written: 2 * time.Minute, Published: -1})
		f.Claim(claimFact{Tenant: "acme", Work: "w7", Attempt: attemptN(7), Age: 3 * time.Minute, Lease: -2 * time.Minute})
		given(t, st, row(7, "acme", "w7", 10))
		f.Claim(claimFact{Tenant: "acme", Work: "w11", Attempt: attemptN(11), Age: 3 * time.Minute, Lease: -2 * time.Minute})
		f.Report(attemptN(11), outcome.AttemptLeaseExpired, eventFact{Stream: event.KindAttempt, Payload: []byte("{}"),
			Written: 2 * time.Minute, OnRow: true})

		dead := func(limit int) []store.DeadAttempt {
			t.Helper()
			got, err := st.DeadAttempts(t.Context(), grace, limit)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		type started struct {
			store.DeadAttempt
			age time.Duration
		}
		want := []started{
			{store.DeadAttempt{AttemptID: attemptN(2), WorkID: "w2", TenantID: "acme", Number: 1, ChargeMicros: 900, Model: "gpt-4o-mini"}, 5 * time.Minute},
			{store.DeadAttempt{AttemptID: attemptN(10), WorkID: "w10", TenantID: "acme", Number: 1, ChargeMicros: 800, Model: "unknown"}, 4 * time.Minute},
			{store.DeadAttempt{AttemptID: attemptN(1), WorkID: "w1", TenantID: "acme", Number: 1, ChargeMicros: 5000, Model: "unknown"}, 3 * time.Minute},
		}
		check := func(what string, got []store.DeadAttempt, want []started) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("%s: %+v, want %+v", what, got, want)
			}
			for i, w := range want {
				g := got[i]
				at := g.StartedAt
				g.StartedAt = time.Time{}
				if g != w.DeadAttempt || !startedAbout(at, w.age) {
					t.Errorf("%s, %d: %+v started %v ago, want %+v started %v ago", what, i, g, time.Since(at), w.DeadAttempt, w.age)
				}
			}
		}
		check("dead attempts", dead(10), want)
		check("dead attempts, limit 1", dead(1), want[:1])
		estimate := row(1, "acme", "w1", 5000)
		estimate.Estimated = true
		given(t, st, estimate)
		check("dead attempts once one has a row", dead(10), want[:2])
	})

	// A reservation older than grace that no attempt claimed is released,
	// once; a claimed one, a young one and a settled one stay, and a kept
	// reservation still bounds its attempt's row.
	run("ReleasesReservationsNoAttemptClaimed", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		const grace = 4 * time.Minute
		f.Reserve("acme", attemptN(1), 5000, time.Hour)
		f.Reserve("acme", attemptN(2), 5000, time.Hour)
		f.Reserve("acme", attemptN(3), 5000, time.Minute)
		f.Reserve("acme", attemptN(4), 5000, time.Hour)
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(2), Age: time.Hour, Lease: time.Minute})
		given(t, st, row(4, "acme", "w1", 10))
		for i, want := range []int64{1, 0} {
			if n, err := st.ReleaseOrphanReservations(t.Context(), grace); err != nil || n != want {
				t.Errorf("pass %d released %d (%v), want %d", i, n, err, want)
			}
		}
		got := record(t, st, row(1, "acme", "w1", 6000), row(2, "acme", "w1", 6000), row(3, "acme", "w1", 6000))
		want := []store.LedgerResult{{Recorded: store.Inserted}, {Recorded: store.Inserted, Excess: 1000}, {Recorded: store.Inserted, Excess: 1000}}
		if !slices.Equal(got, want) {
			t.Errorf("rows after the release: %+v, want %+v (the released reservation bounds nothing)", got, want)
		}
	})

	// Usage totals one tenant's rows over [from, to), by outcome or by
	// model in key order, and tells the estimated part apart.
	run("TotalsUsage", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Tenant("globex", "us", "tok-globex")
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		f.Claim(claimFact{Tenant: "globex", Work: "w2", Attempt: attemptN(2), Lease: time.Minute})
		to := day.Add(24 * time.Hour)
		at := func(r store.LedgerRow, result, model string, in, out int64, when time.Time) store.LedgerRow {
			r.Outcome, r.Model, r.InputUnits, r.OutputUnits, r.OccurredAt = result, model, in, out, when
			return r
		}
		estimated := at(row(14, "acme", "w1", 40), outcome.AttemptLeaseExpired, "unknown", 0, 0, day.Add(2*time.Hour))
		estimated.Estimated = true
		given(t, st,
			at(row(11, "acme", "w1", 21), outcome.AttemptOK, "assay-sim-1", 100, 10, day),
			at(row(12, "acme", "w1", 27), outcome.AttemptInvalidOutput, "assay-sim-1", 100, 20, day.Add(time.Hour)),
			at(row(13, "acme", "w1", 11), outcome.AttemptOK, "gpt-4o-mini", 50, 5, to.Add(-time.Second)),
			estimated,
			at(row(15, "acme", "w1", 9999), outcome.AttemptOK, "assay-sim-1", 9999, 9999, to),
			at(row(16, "acme", "w1", 9999), outcome.AttemptOK, "assay-sim-1", 9999, 9999, day.Add(-time.Second)),
			at(row(17, "globex", "w2", 7777), outcome.AttemptOK, "assay-sim-1", 7777, 7777, day.Add(time.Hour)),
		)
		byOutcome := []store.UsageLine{
			{Key: outcome.AttemptInvalidOutput, Calls: 1, InputUnits: 100, OutputUnits: 20, CostMicros: 27},
			{Key: outcome.AttemptLeaseExpired, Calls: 1, CostMicros: 40, EstimatedCalls: 1, EstimatedCostMicros: 40},
			{Key: outcome.AttemptOK, Calls: 2, InputUnits: 150, OutputUnits: 15, CostMicros: 32},
		}
		if got := usage(t, st, "acme", store.ByOutcome); !slices.Equal(got, byOutcome) {
			t.Errorf("by outcome %+v, want %+v", got, byOutcome)
		}
		byModel := []store.UsageLine{
			{Key: "assay-sim-1", Calls: 2, InputUnits: 200, OutputUnits: 30, CostMicros: 48},
			{Key: "gpt-4o-mini", Calls: 1, InputUnits: 50, OutputUnits: 5, CostMicros: 11},
			{Key: "unknown", Calls: 1, CostMicros: 40, EstimatedCalls: 1, EstimatedCostMicros: 40},
		}
		if got := usage(t, st, "acme", store.ByModel); !slices.Equal(got, byModel) {
			t.Errorf("by model %+v, want %+v", got, byModel)
		}
		if got, err := st.Usage(t.Context(), "acme", to.Add(time.Hour), to.Add(2*time.Hour), store.ByOutcome); err != nil || len(got) != 0 {
			t.Errorf("usage of an empty period: %+v, %v; want none", got, err)
		}
		if _, err := st.Usage(t.Context(), "acme", day, to, "tenant"); err == nil {
			t.Error("usage by tenant answered, want an error")
		}
	})

	// A token names its tenant as it stands; an unknown token is not found.
	run("ResolvesTokens", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Tenant("globex", "eu", "tok-globex")
		f.Suspend("globex")
		for token, want := range map[string]store.Tenant{
			"tok-acme":   {ID: "acme", HomeRegion: "us", Status: store.TenantActive, RatePerMinute: 600, Burst: 60},
			"tok-globex": {ID: "globex", HomeRegion: "eu", Status: store.TenantSuspended, RatePerMinute: 600, Burst: 60},
		} {
			if got, err := st.TenantByToken(t.Context(), token); err != nil || got != want {
				t.Errorf("%s: %+v (%v), want %+v", token, got, err, want)
			}
		}
		if _, err := st.TenantByToken(t.Context(), "tok-nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("an unknown token: %v, want ErrNotFound", err)
		}
	})

	// A store that does not answer fails every call with an error that is
	// neither a refusal for good nor a token not found, so the ledger
	// retries and a reader is told to come back.
	run("FailsWhileDown", func(t *testing.T, st Store, f storeFacts) {
		f.Tenant("acme", "us", "tok-acme")
		f.Claim(claimFact{Tenant: "acme", Work: "w1", Attempt: attemptN(1), Lease: time.Minute})
		ctx := t.Context()
		if err := st.Ping(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
		f.Down()
		if err := st.Ping(ctx); err == nil {
			t.Error("ping answered")
		}
		for i, r := range record(t, st, row(1, "acme", "w1", 10), row(2, "acme", "w1", 10)) {
			if r.Err == nil || store.Permanent(r.Err) {
				t.Errorf("row %d: %+v, want an error worth retrying", i, r)
			}
		}
		if _, err := st.TenantByToken(ctx, "tok-acme"); err == nil || errors.Is(err, store.ErrNotFound) {
			t.Errorf("token: %v, want an error other than not found", err)
		}
		if _, err := st.UnrecordedEvents(ctx, event.KindAttempt, grace, horizon, 10); err == nil {
			t.Error("unrecorded events answered")
		}
		if _, err := st.DeadAttempts(ctx, grace, 10); err == nil {
			t.Error("dead attempts answered")
		}
		if _, err := st.ReleaseOrphanReservations(ctx, grace); err == nil {
			t.Error("release answered")
		}
		if _, err := st.Usage(ctx, "acme", day, day.Add(time.Hour), store.ByOutcome); err == nil {
			t.Error("usage answered")
		}
	})
}

// pgFacts puts facts into the database through *store.Store, as the rest
// of the cell writes them, and then ages the rows with SQL.
type pgFacts struct {
	t      *testing.T
	st     *store.Store
	db     *pgxpool.Pool
	claims map[string]claimFact // by attempt
}

var _ storeFacts = (*pgFacts)(nil)

// openPostgresStore is a fresh database.
func openPostgresStore(t *testing.T) (Store, storeFacts) {
	st, db := newTestDatabase(t)
	return st, &pgFacts{t: t, st: st, db: db, claims: map[string]claimFact{}}
}

func (f *pgFacts) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.db.Exec(f.t.Context(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *pgFacts) Tenant(id, home, token string) {
	f.t.Helper()
	ctx := f.t.Context()
	if err := f.st.SeedTenants(ctx, []store.TenantSeed{{ID: id, HomeRegion: home, Token: token}}); err != nil {
		f.t.Fatal(err)
	}
	budget := int64(1) << 50
	if err := f.st.SetBudget(ctx, id, &budget, "month"); err != nil {
		f.t.Fatal(err)
	}
}

func (f *pgFacts) Suspend(tenant string) {
	f.t.Helper()
	if err := f.st.SetStatus(f.t.Context(), tenant, store.TenantSuspended); err != nil {
		f.t.Fatal(err)
	}
}

func (f *pgFacts) Reserve(tenant, attempt string, amount int64, age time.Duration) {
	f.t.Helper()
	if res, err := f.st.Reserve(f.t.Context(), tenant, attempt, amount); err != nil || res != store.Reserved {
		f.t.Fatalf("reserve for %s: %v %v", attempt, res, err)
	}
	f.exec(`UPDATE budget_reservations SET created_at = now() - $2::bigint * interval '1 microsecond'
		WHERE attempt_id = $1`, attempt, age.Microseconds())
}

func (f *pgFacts) Claim(c claimFact) {
	f.t.Helper()
	ctx := f.t.Context()
	if _, _, err := f.st.InsertWork(ctx, &store.Work{ID: c.Work, TenantID: c.Tenant, Region: "us", Contract: "moderation",
		SchemaVersion: "1", TaxonomyVersion: "1", SourceID: "t/" + c.Work, Revision: "r1", Lane: event.Batch,
		Input: `{"text":"x"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)},
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		f.t.Fatal(err)
	}
	if _, ok, err := f.st.Claim(ctx, c.Work, c.Attempt, leaseToken(c.Attempt), time.Minute, c.Estimate); err != nil || !ok {
		f.t.Fatalf("claim %s for %s: %v %v", c.Work, c.Attempt, ok, err)
	}
	f.exec(`UPDATE attempts SET started_at = now() - $2::bigint * interval '1 microsecond' WHERE id = $1`,
		c.Attempt, c.Age.Microseconds())
	f.exec(`UPDATE work SET lease_expires_at = now() + $2::bigint * interval '1 microsecond' WHERE id = $1`,
		c.Work, c.Lease.Microseconds())
	f.claims[c.Attempt] = c
}

func (f *pgFacts) Report(attempt, result string, events ...eventFact) {
	f.t.Helper()
	c, ok := f.claims[attempt]
	if !ok {
		f.t.Fatalf("attempt %s never claimed", attempt)
	}
	names := event.Names{Cell: "us"}
	var msgs []store.OutboxMsg
	for _, e := range events {
		m := store.OutboxMsg{Stream: e.Stream, Subject: names.Prefix(e.Stream) + c.Tenant, MsgID: attempt, Payload: e.Payload,
			NoRow: e.OnRow}
		if e.NoCall {
			m.Headers = map[string]string{event.NoCallHeader: "1"}
		}
		msgs = append(msgs, m)
	}
	if _, err := f.st.RecordAttempt(f.t.Context(), store.AttemptRecord{AttemptID: attempt, WorkID: c.Work,
		LeaseToken: leaseToken(attempt), Outcome: result, Outbox: msgs}); err != nil {
		f.t.Fatal(err)
	}
	for _, e := range events {
		if e.OnRow {
			f.exec(`UPDATE attempts SET finished_at = now() - $2::bigint * interval '1 microsecond' WHERE id = $1`,
				attempt, e.Written.Microseconds())
			continue
		}
		var published *int64 // NULL: not published
		if e.Published >= 0 {
			us := e.Published.Microseconds()
			published = &us
		}
		f.exec(`UPDATE outbox SET created_at = now() - $3::bigint * interval '1 microsecond',
				published_at = now() - $4::bigint * interval '1 microsecond'
			WHERE msg_id = $1 AND stream = $2`, attempt, e.Stream, e.Written.Microseconds(), published)
	}
}

func (f *pgFacts) Down() { f.st.Close() }
