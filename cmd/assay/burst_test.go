package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// burstDiffs serves each pull request's diff from the evaluation set, one
// item per head revision.
type burstDiffs struct{}

func (burstDiffs) Diff(_ context.Context, pr ingress.PullRef) (string, error) {
	items := evalset.Items()
	n, _ := strconv.ParseInt(pr.HeadSHA[len(pr.HeadSHA)-6:], 16, 64)
	return items[int(n)%len(items)].Diff, nil
}

// burstEvent is one webhook delivery of the probe.
type burstEvent struct {
	at       time.Duration
	delivery string
	action   string
	pr       int
	head     string
	updated  time.Time
}

// burstAnswer is what ingress answered one delivery.
type burstAnswer struct {
	ev     burstEvent
	status int
	resp   ingress.WebhookResponse
}

// The burst probe: ninety webhook deliveries for forty pull requests in
// about three seconds (each opened once, 25 delivered twice, 25
// force-pushed while their first review may run) against a provider that
// serves four reviews a second. Every delivery ends in an outcome the test
// can explain: queued (then accepted, or superseded by its force-push), a
// duplicate of a delivery already taken, or dropped for capacity with the
// command that asks again; nothing is left queued or running, and the
// rerun command of a dropped review queues it and it is accepted.
func TestBurstProbe(t *testing.T) {
	t.Parallel()
	const secret = "burst-probe-secret"
	b := celltest.Setup(t, cell.Options{
		Classifier: classifier.Config{Concurrency: 2, FixedConcurrency: true, ReportEvery: 100 * time.Millisecond},
		Ingress: ingress.Config{GitHubSecret: secret, Diffs: burstDiffs{}, InteractiveDeadline: 2 * time.Minute, SweepEvery: time.Second,
			Shed: ingress.ShedConfig{QueueWait: time.Second}},
	})
	ctx := t.Context()
	if err := b.Sim.SetCapacity(sim.Capacity{Concurrency: 2, Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 500 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Cell.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: "777",
		Tenant: "acme", Repositories: []string{"shop/*"}}); err != nil {
		t.Fatal(err)
	}
	// The probe is of capacity: the tenant's rate (600 a minute, a burst of
	// 60, by default) would refuse the burst's last deliveries whenever the
	// ninety arrive in less than three seconds.
	if err := b.Cell.Env.Store.SetRate(ctx, "acme", 60000, 1000); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); !b.Cell.Ingress.CapacityKnown(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("ingress read no capacity report")
		}
	}

	span := 3 * time.Second
	opened := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
	var evs []burstEvent
	for i := range 40 {
		at := time.Duration(i) * span / 80
		open := burstEvent{at: at, delivery: fmt.Sprintf("burst-open-%d", i), action: "opened", pr: 100 + i,
			head: fmt.Sprintf("%040x", i), updated: opened}
		evs = append(evs, open)
		if i < 25 {
			again := open
			again.at += span / 10
			evs = append(evs, again) // GitHub redelivers the same delivery
		}
		if i >= 15 {
			evs = append(evs, burstEvent{at: at + span/6, delivery: fmt.Sprintf("burst-push-%d", i), action: "synchronize",
				pr: 100 + i, head: fmt.Sprintf("%040x", 0x10000+i), updated: opened.Add(time.Minute)})
		}
	}
	if len(evs) != 90 {
		t.Fatalf("%d deliveries, want 90", len(evs))
	}
	slices.SortFunc(evs, func(a, b burstEvent) int { return int(a.at - b.at) })

	answers := make([]burstAnswer, len(evs))
	start := time.Now()
	var wg sync.WaitGroup
	for i, ev := range evs {
		time.Sleep(time.Until(start.Add(ev.at)))
		wg.Go(func() { answers[i] = deliverBurst(t, b, secret, ev) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Settled: nothing queued or running (bounded only so a hang fails).
	for end := time.Now().Add(2 * time.Minute); b.Count(t, `SELECT count(*) FROM work WHERE state IN ('queued', 'running')`) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("work still queued or running two minutes after the burst")
		}
	}

	// Every delivery is explained.
	seen := map[string]bool{}
	var droppedIDs []string
	why := map[string]int{}
	for _, a := range answers {
		id := ingress.WorkID("acme", ingress.WebhookContract, fmt.Sprintf("shop/checkout#%d", a.ev.pr), a.ev.head)
		var final string
		if err := b.DB.QueryRow(ctx, `SELECT state FROM work WHERE id = $1`, id).Scan(&final); err != nil {
			t.Fatalf("delivery %s: no work %s: %v", a.ev.delivery, id, err)
		}
		// The two copies of a redelivered event race: whichever the cell
		// stored first is taken, the other is its duplicate, in either
		// order.
		first := !(a.status == http.StatusOK && a.resp.Duplicate)
		if first && seen[a.ev.delivery] {
			t.Errorf("delivery %s was taken twice", a.ev.delivery)
		}
		seen[a.ev.delivery] = seen[a.ev.delivery] || first
		switch {
		case !first && a.resp.WorkID == id:
			why["duplicate"]++
		case first && a.status == http.StatusAccepted && a.resp.State == "superseded" && final == "superseded" && a.ev.action == "opened":
			// Its force-push was stored first: the opening revision is
			// superseded as it arrives.
			why["queued, then superseded"]++
		case first && a.status == http.StatusAccepted && a.resp.State == "queued" && (final == "accepted" || final == "superseded"):
			if final == "superseded" && a.ev.action != "opened" {
				t.Errorf("delivery %s: the newest revision %s ended superseded", a.ev.delivery, id)
			}
			why["queued, then "+final]++
		case first && a.status == http.StatusAccepted && a.resp.State == "dropped" && final == "dropped":
			want := "ask again with: assay work rerun " + id + " --region us"
			if !strings.Contains(a.resp.Reason, want) || !strings.Contains(a.resp.Reason, "at capacity") {
				t.Errorf("delivery %s dropped without its reason and rerun command: %q", a.ev.delivery, a.resp.Reason)
			}
			why["dropped for capacity"]++
			if a.ev.action == "synchronize" || a.ev.pr < 115 {
				droppedIDs = append(droppedIDs, id) // the newest revision of its pull request
			}
		default:
			t.Errorf("delivery %s (%s of PR %d): HTTP %d, state %q, duplicate %v, ended %q: not an outcome the probe explains",
				a.ev.delivery, a.ev.action, a.ev.pr, a.status, a.resp.State, a.resp.Duplicate, final)
		}
	}
	t.Logf("outcomes: %v", why)
	if why["duplicate"] != 25 {
		t.Errorf("%d duplicates, want the 25 redeliveries", why["duplicate"])
	}
	if why["dropped for capacity"] == 0 || len(droppedIDs) == 0 {
		t.Fatalf("no newest revision was dropped: the burst never went over the small capacity (%v)", why)
	}
	if n := b.Count(t, `SELECT count(*) FROM work WHERE state NOT IN ('accepted', 'superseded', 'dropped')`); n != 0 {
		t.Errorf("%d work items ended otherwise than accepted, superseded or dropped", n)
	}

	// The rerun command of a dropped review works.
	id := droppedIDs[0]
	var out bytes.Buffer
	if err := workCmd(ctx, []string{"rerun", id, "--region", "us", "--database-url", b.Cell.Env.Config.DatabaseURL}, &out); err != nil {
		t.Fatalf("assay work rerun %s: %v", id, err)
	}
	if v := b.Wait(t, id); v.Outcome == nil || *v.Outcome != "accepted" {
		t.Fatalf("rerun %s ended %v (%s), want accepted", id, v.Outcome, v.Reason)
	}
}

func deliverBurst(t *testing.T, b *celltest.Bundle, secret string, ev burstEvent) burstAnswer {
	body, _ := json.Marshal(ingress.PullRequestEvent{Action: ev.action, Number: int64(ev.pr),
		PullRequest: ingress.PullRequest{Number: int64(ev.pr), Title: fmt.Sprintf("PR %d", ev.pr),
			Head: ingress.GitRef{SHA: ev.head}, Base: ingress.GitRef{SHA: strings.Repeat("b", 40)}, UpdatedAt: ev.updated},
		Repository: ingress.Repository{FullName: "shop/checkout"}, Installation: &ingress.Installation{ID: 777}})
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/webhooks/github", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "pull_request")
	req.Header.Set("X-GitHub-Delivery", ev.delivery)
	req.Header.Set("X-Hub-Signature-256", ingress.Sign(secret, body))
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Errorf("delivery %s: %v", ev.delivery, err)
		return burstAnswer{ev: ev}
	}
	defer resp.Body.Close()
	a := burstAnswer{ev: ev, status: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&a.resp); err != nil {
		t.Errorf("delivery %s: HTTP %d, undecodable answer: %v", ev.delivery, resp.StatusCode, err)
	}
	return a
}
