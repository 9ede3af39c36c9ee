package cell_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/services/ingress"
)

// Transport faults: each ends as its outcome says, every call is a ledger
// row, and a retry waits at least the Retry-After the provider gave.
func TestTransportFaults(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	cases := []struct {
		fault    sim.Fault
		outcome  string
		attempts []string // attempt outcomes in order
		deadline int
	}{
		// The deadline is enforced on the caller's side: a hanging provider
		// is cut off when the work's deadline arrives. It goes first: with
		// a 2 s deadline it may wait 200 ms, and admission rightly refuses
		// it behind the others.
		{sim.Fault{Kind: sim.FaultHang, Times: 1}, "retry_exhausted", []string{"timeout"}, 2},
		{sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: time.Second, Times: 1}, "accepted", []string{"rate_limited", "ok"}, 0},
		{sim.Fault{Kind: sim.FaultServerError, Times: 1}, "accepted", []string{"transport_error", "ok"}, 0},
		{sim.Fault{Kind: sim.FaultReject, Times: 1}, "transport_rejected", []string{"transport_rejected"}, 0},
		{sim.Fault{Kind: sim.FaultExtraProperty, Times: 1}, "accepted", []string{"invalid_output", "ok"}, 0},
	}
	ids := make([]string, len(cases))
	for i, tc := range cases {
		title := "transport case " + tc.fault.Kind
		tc.fault.Tenant, tc.fault.Match = "acme", title
		if err := b.Sim.AddFault(tc.fault); err != nil {
			t.Fatal(err)
		}
		req := celltest.CodeReview(evalset.Items()[3], title)
		req.SourceID = "shop/transport#" + tc.fault.Kind
		req.DeadlineSeconds = tc.deadline
		_, r := b.Submit(t, req)
		ids[i] = r.WorkID
	}
	total := 0
	for i, tc := range cases {
		t.Run(tc.fault.Kind, func(t *testing.T) {
			v := b.Wait(t, ids[i])
			if *v.Outcome != tc.outcome {
				t.Fatalf("outcome %s (%s), want %s", *v.Outcome, v.Reason, tc.outcome)
			}
			var got []string
			for _, a := range v.Attempts {
				got = append(got, a.Outcome)
			}
			if strings.Join(got, ",") != strings.Join(tc.attempts, ",") {
				t.Fatalf("attempts %v, want %v", got, tc.attempts)
			}
			if tc.fault.Kind == sim.FaultRateLimit {
				gap := v.Attempts[1].StartedAt.Sub(*v.Attempts[0].FinishedAt)
				if gap < tc.fault.RetryAfter {
					t.Errorf("retried %s after a 429 that asked for %s", gap, tc.fault.RetryAfter)
				}
			}
			if tc.fault.Kind == sim.FaultHang && !strings.Contains(v.Reason, "deadline") {
				t.Errorf("reason %q does not mention the deadline", v.Reason)
			}
		})
		total += len(tc.attempts)
	}
	b.WaitLedger(t, "acme", total)
	if n := b.Calls("acme"); n != int64(total) {
		t.Errorf("model calls %d, ledger rows %d", n, total)
	}
	if n := b.Count(t, `SELECT count(*) FROM ledger WHERE outcome = 'rate_limited'`); n != 1 {
		t.Errorf("rate-limited attempts in the ledger = %d, want 1", n)
	}
}

// A worker that claimed work and died: its lease lapses, the sweeper
// announces the work again under a new dispatch number, and another worker
// finishes it.
func TestSweeperRecoversAbandonedClaim(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{NoClassifier: true, Ingress: ingress.Config{
		SweepEvery: 100 * time.Millisecond, LeaseGrace: 100 * time.Millisecond}})
	_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[4], "abandoned"))
	ctx := context.Background()
	// The dead worker: it took the lease and was never heard of again.
	if _, ok, err := b.Cell.Env.Store.Claim(ctx, r.WorkID, "00000000-0000-4000-8000-000000000001",
		"00000000-0000-4000-8000-000000000002", 2*time.Second, 0); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if err := b.Cell.Classifier.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Cell.Classifier.Stop(context.Background()) })
	v := b.Wait(t, r.WorkID)
	if *v.Outcome != "accepted" {
		t.Fatalf("outcome %s (%s), want accepted", *v.Outcome, v.Reason)
	}
	if n := b.Count(t, `SELECT dispatch FROM work WHERE id = $1`, r.WorkID); n < 2 {
		t.Errorf("dispatch = %d, want a re-announcement", n)
	}
	if n := b.Calls("acme"); n != 1 {
		t.Errorf("model calls = %d, want 1", n)
	}
	if len(v.Attempts) != 2 || v.Attempts[0].Outcome != "lease_expired" || v.Attempts[1].Outcome != "ok" {
		t.Errorf("attempts %+v, want the abandoned one lease_expired, then ok", v.Attempts)
	}
}

// Queued work whose announcement a worker holds unacknowledged (waiting
// for its tenant's turn, say) is not lost, however long it has waited:
// the sweeper leaves it alone. Once the announcement is acknowledged and
// the work is still queued, nothing will deliver it again, and the sweeper
// announces it anew.
func TestSweeperLeavesHeldAnnouncementsAlone(t *testing.T) {
	t.Parallel()
	// Also the head's allowance for the relay's lag: well above what a
	// loaded machine takes from a work row to its message.
	const queuedFor = 3 * time.Second
	b := celltest.Setup(t, cell.Options{NoClassifier: true, Ingress: ingress.Config{
		SweepEvery: time.Hour, QueuedFor: queuedFor}})
	// older waits until work was written more than QueuedFor ago by the
	// database's clock, the one the sweeper reads.
	older := func(ids ...string) {
		t.Helper()
		poll(t, "work queued longer than QueuedFor", 30*time.Second, func() bool {
			return b.Count(t, `SELECT count(*) FROM work WHERE id = ANY($1) AND updated_at < now() - $2 * interval '1 microsecond'`,
				ids, queuedFor.Microseconds()) == len(ids)
		})
	}
	ctx := context.Background()
	n, js := b.Names(), b.Cell.Env.JS
	cons, err := js.CreateOrUpdateConsumer(ctx, n.Stream(event.KindWork), jetstream.ConsumerConfig{
		Durable: n.WorkConsumer(event.Interactive), FilterSubject: n.Lane(event.Interactive),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The first is announced well before the others (more than QueuedFor,
	// the head's allowance for the relay's lag).
	var ids []string
	for i := range 3 {
		if i == 1 {
			older(ids[0])
		}
		_, r := b.Submit(t, celltest.CodeReview(evalset.Items()[i], fmt.Sprintf("held %d", i)))
		ids = append(ids, r.WorkID)
	}
	var held []jetstream.Msg
	deadline := time.Now().Add(20 * time.Second)
	for len(held) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d announcements delivered after 20s", len(held), len(ids))
		}
		batch, err := cons.Fetch(len(ids)-len(held), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			held = append(held, m)
		}
	}
	dispatches := func() []int {
		var out []int
		for _, id := range ids {
			out = append(out, b.Count(t, `SELECT dispatch FROM work WHERE id = $1 AND state = 'queued'`, id))
		}
		return out
	}
	older(ids...) // so only the held announcements keep the sweeper off them
	if err := b.Cell.Ingress.SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := dispatches(); !slices.Equal(got, []int{1, 1, 1}) {
		t.Fatalf("dispatch numbers %v while a worker holds every announcement; want each left at 1", got)
	}
	// The first is acknowledged with its work still queued: it alone is
	// lost (the others' announcements are still held).
	if err := held[0].Ack(); err != nil {
		t.Fatal(err)
	}
	var first int
	for i, id := range ids {
		if strings.Contains(string(held[0].Data()), id) {
			first = i
		}
	}
	want := []int{1, 1, 1}
	want[first] = 2
	poll(t, "the acknowledged work announced again", 30*time.Second, func() bool {
		if err := b.Cell.Ingress.SweepOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return slices.Equal(dispatches(), want)
	})
	if got := dispatches(); !slices.Equal(got, want) {
		t.Fatalf("dispatch numbers %v, want %v", got, want)
	}
}
