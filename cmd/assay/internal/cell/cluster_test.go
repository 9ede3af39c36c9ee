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
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ledger"
)

// A cell on a three-node JetStream cluster with R3 streams loses the
// leader of its WORK stream mid-run, and later the leader of its RESULT
// stream: no work is lost, none is committed twice, every attempt is one
// ledger row, work submitted after each loss finishes too, and each node
// started again catches up with its streams.
func TestR3StreamLeaderLoss(t *testing.T) {
	t.Parallel()
	const tag = "region:us"
	begun := time.Now()
	c := testenv.NewCluster(t, 3, tag)
	// A message the server delivered as its node went down, or an ack
	// sent to it, is lost on the way and delivered again after the ack
	// wait; a short one keeps that path within the test's patience.
	const ackWait = 5 * time.Second
	b := celltest.SetupOn(t, cell.Options{
		Config:     config.Config{Streams: event.StreamSettings{Replicas: 3, Placement: []string{tag}}},
		Classifier: classifier.Config{AckWait: ackWait}, Committer: committer.Config{AckWait: ackWait},
		Ledger: ledger.Config{AckWait: ackWait},
	}, nil, c.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names, js := b.Names(), b.Cell.Env.JS
	kinds := []string{event.KindWork, event.KindResult, event.KindAttempt}

	// Every stream of the cell is R3, placed by the tag, with a leader and
	// two current replicas; so is every durable, once its consumer made it
	// (the classifier's two lanes on WORK, the committer's on RESULT, the
	// committer's and the ledger's on ATTEMPT).
	durables := map[string]int{event.KindWork: 2, event.KindResult: 1, event.KindAttempt: 2}
	for _, kind := range kinds {
		st, err := js.Stream(ctx, names.Stream(kind))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if info.Config.Replicas != 3 || info.Config.Placement == nil || !slices.Equal(info.Config.Placement.Tags, []string{tag}) {
			t.Fatalf("stream %s: replicas %d, placement %+v; want 3 placed by %s", info.Config.Name, info.Config.Replicas, info.Config.Placement, tag)
		}
		if err := c.WaitStreamCurrent(info.Config.Name, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if info, err = st.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if peers := clusterPeers(info.Cluster); len(peers) != 3 {
			t.Fatalf("stream %s has peers %v, want 3", info.Config.Name, peers)
		}
		waitFor(t, 20*time.Second, func() (bool, string) {
			var got []string
			for ci := range st.ListConsumers(ctx).Info() {
				if peers := clusterPeers(ci.Cluster); len(peers) == 3 {
					got = append(got, ci.Name)
				}
			}
			return len(got) == durables[kind], fmt.Sprintf("stream %s: durables with 3 peers %v, want %d", info.Config.Name, got, durables[kind])
		})
	}

	t.Logf("cluster, cell and R3 streams and durables ready in %s", time.Since(begun).Round(time.Millisecond))
	items := evalset.Items()
	var ids []string
	submit := func(n int) []string {
		t.Helper()
		var batch []string
		for range n {
			i := len(ids)
			req := celltest.CodeReview(items[i%len(items)], fmt.Sprintf("leader loss %d", i))
			req.SourceID, req.Lane = fmt.Sprintf("shop/cluster#%d", i), "batch"
			_, r := b.Submit(t, req)
			ids = append(ids, r.WorkID)
			batch = append(batch, r.WorkID)
			time.Sleep(20 * time.Millisecond)
		}
		return batch
	}
	// loseLeader shuts down the node that leads kind's stream, and the
	// durable that reads it (moved there first: the worst case, where the
	// consumer's pull requests are lost with the node), while work is on
	// its way; submits more while the stream elects another leader; and
	// waits for that work to finish. The node is started again and must
	// catch up.
	loseLeader := func(kind, durable string) {
		t.Helper()
		stream := names.Stream(kind)
		leader, err := c.WaitStreamLeader(stream, "", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		moving := time.Now()
		if err := c.MoveConsumerLeader(stream, durable, leader, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s leads %s and %s after %s", leader, stream, durable, time.Since(moving).Round(time.Millisecond))
		before := submit(15)
		lost := time.Now()
		c.Stop(t, leader)
		next, err := c.WaitStreamLeader(stream, leader, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		elected := time.Since(lost)
		after := submit(15)
		waitFor(t, 60*time.Second, func() (bool, string) {
			done := b.Count(t, `SELECT count(*) FROM work WHERE id = ANY($1) AND state NOT IN ('queued', 'running')`, after)
			return done == len(after), fmt.Sprintf("%d of %d works submitted after %s (leading %s and %s) was shut down have an outcome",
				done, len(after), leader, stream, durable)
		})
		// The pause: the longest time between two commits of the work
		// submitted around the shutdown, at a steady pace.
		var resumed time.Time
		var pause float64
		if err := b.DB.QueryRow(ctx, `SELECT (SELECT min(created_at) FROM results WHERE work_id = ANY($1)),
			(SELECT extract(epoch FROM max(gap))::float8 FROM (SELECT created_at - lag(created_at) OVER (ORDER BY created_at) AS gap
				FROM results WHERE work_id = ANY($1) OR work_id = ANY($2)) g)`, after, before).Scan(&resumed, &pause); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s (leading it and %s) shut down; %s leads it after %s; the first work submitted after that committed %s after the shutdown, all %d by %s; the longest time between two commits %.3fs; %s leads %s",
			stream, leader, durable, next, elected.Round(time.Millisecond), resumed.Sub(lost).Round(time.Millisecond),
			len(after), time.Since(lost).Round(time.Millisecond), pause, c.ConsumerLeader(stream, durable), durable)
		started := time.Now()
		c.Start(t, leader)
		for _, k := range kinds {
			if err := c.WaitStreamCurrent(names.Stream(k), 30*time.Second); err != nil {
				t.Fatalf("after %s started again: %v", leader, err)
			}
		}
		t.Logf("%s started again: its streams caught up in %s", leader, time.Since(started).Round(time.Millisecond))
	}
	loseLeader(event.KindWork, classifier.Consumer(names, "batch"))
	loseLeader(event.KindAttempt, committer.Consumer(names))
	submit(5)

	waited := time.Now()
	for _, id := range ids {
		if v := b.Wait(t, id); *v.Outcome != outcome.Accepted {
			t.Errorf("work %s: %s (%s), want accepted", id, *v.Outcome, v.Reason)
		}
	}
	t.Logf("%d works accepted, the last %s after the last submission", len(ids), time.Since(waited).Round(time.Millisecond))
	if n := b.Count(t, `SELECT count(*) FROM work`); n != len(ids) {
		t.Errorf("work rows %d, submitted %d", n, len(ids))
	}
	// The commit fence: one result per work, for every work.
	if n := b.Count(t, `SELECT count(DISTINCT work_id) FROM results WHERE work_id = ANY($1)`, ids); n != len(ids) {
		t.Errorf("works with a result %d, want %d", n, len(ids))
	}
	if n := b.Count(t, `SELECT count(*) FROM (SELECT work_id FROM results GROUP BY work_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d works have more than one result", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM results`); n != len(ids) {
		t.Errorf("result rows %d, want %d", n, len(ids))
	}
	// Every attempt is one ledger row and one provider call.
	attempts := b.Count(t, `SELECT count(*) FROM attempts`)
	if attempts < len(ids) {
		t.Errorf("attempts %d, fewer than the %d works", attempts, len(ids))
	}
	// The ledger records attempts as their events arrive; one it waits
	// for is named with where its event is.
	waitFor(t, 20*time.Second, func() (bool, string) {
		rows := b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = 'acme'`)
		if rows == attempts {
			return true, ""
		}
		var missing []string
		rs, err := b.DB.Query(ctx, `SELECT a.id::text FROM attempts a LEFT JOIN ledger l ON l.attempt_id = a.id WHERE l.attempt_id IS NULL`)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var id string
			if err := rs.Scan(&id); err != nil {
				t.Fatal(err)
			}
			published := b.Count(t, `SELECT count(*) FROM outbox WHERE stream = $1 AND msg_id LIKE '%' || $2 || '%' AND published_at IS NOT NULL`, event.KindAttempt, id)
			missing = append(missing, fmt.Sprintf("%s (outbox rows published %d)", id, published))
		}
		rs.Close()
		durable := "unknown"
		if cons, err := js.Consumer(ctx, names.Stream(event.KindAttempt), ledger.Consumer(names)); err == nil {
			ci := cons.CachedInfo()
			durable = fmt.Sprintf("delivered %d, ack floor %d, pending %d, ack pending %d, redelivered %d, waiting %d, leader %q",
				ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, c.ConsumerLeader(names.Stream(event.KindAttempt), ledger.Consumer(names)))
		} else {
			durable = err.Error()
		}
		return false, fmt.Sprintf("ledger rows %d, attempts %d; attempts without a row: %v; the ledger's durable: %s", rows, attempts, missing, durable)
	})
	if n := b.Count(t, `SELECT count(*) FROM ledger l JOIN attempts a ON a.id = l.attempt_id`); n != attempts {
		t.Errorf("ledger rows matching an attempt %d, attempts %d", n, attempts)
	}
	if calls := b.Calls("acme"); calls != int64(attempts) {
		t.Errorf("provider calls %d, attempts %d", calls, attempts)
	}
	// Each stream holds every message the relays published, once: a
	// relay's publish retried across an election was stored once.
	waitFor(t, 20*time.Second, func() (bool, string) {
		n := b.Count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
		return n == 0, fmt.Sprintf("%d outbox rows unpublished", n)
	})
	for _, kind := range kinds {
		// A new work's own announcement has no row: the ingress publishes it.
		want := b.Count(t, `SELECT count(DISTINCT msg_id) FROM outbox WHERE stream = $1`, kind)
		switch kind {
		case event.KindWork:
			want += b.Count(t, `SELECT count(*) FROM work w WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = w.id || '.1')`)
		case event.KindAttempt:
			// An attempt's ATTEMPT event kept on its row: its worker publishes it.
			want += b.Count(t, `SELECT count(*) FROM attempts a WHERE a.event IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = a.id::text)`)
		}
		info, err := b.Cell.Env.JS.Stream(ctx, names.Stream(kind))
		if err != nil {
			t.Fatal(err)
		}
		// RESULT holds only what classifiers of earlier releases published.
		if got := info.CachedInfo().State.Msgs; got != uint64(want) || (want == 0) != (kind == event.KindResult) {
			t.Errorf("stream %s holds %d messages, the outbox published %d", names.Stream(kind), got, want)
		}
	}
}

// clusterPeers are the leader and replicas of a clustered stream or
// consumer.
func clusterPeers(ci *jetstream.ClusterInfo) []string {
	if ci == nil || ci.Leader == "" {
		return nil
	}
	peers := []string{ci.Leader}
	for _, r := range ci.Replicas {
		if r.Current {
			peers = append(peers, r.Name)
		}
	}
	return peers
}

// waitFor polls cond until it holds, and fails with what it last said was
// missing when within has passed.
func waitFor(t *testing.T, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, missing := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, strings.TrimSpace(missing))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
