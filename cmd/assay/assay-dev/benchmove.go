package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

const benchMoveUsage = `usage: assay-dev bench move [--duration 60s] [--rate 4] [--model-latency 5s] [--webhooks 0.25] [--dups 0.2]
                        [--move-after 5s] [-c 64] [--pool 2] [--settle 2m] [--wait 3m]

Two cells of region us (us and us-2) in this process, on one NATS and one
Postgres server, and one tenant, t1, under a steady load for the whole run:
--rate requests a second, open loop (at most -c at once), API submissions
(POST /v1/work) and a share --webhooks of GitHub pull_request deliveries
signed with the tenant's webhook secret, each new one sent to the cells in
turn, and a share --dups a duplicate of a recent one (the same key, or the
same delivery) sent to the other cell. The simulated provider answers each
model call after --model-latency. Once the load has run --move-after and a
call has been in flight for half the latency, the tenant is moved from us to
us-2 (placement.Move), and --move-after after that move ends (again with a
call in flight), back to us; the load runs --duration in all, and at least
--move-after past the second move. A request answered 503 is not sent
again: it is counted. Then every work item ends and the ledger catches up
(up to --wait), and it prints a line of what the run was, then one of:
  the requests sent while a move ran, those of them answered other than
  2xx (or not at all), and of all requests; work lost (an accepted
  request whose work is not in the cell that serves the tenant at the end,
  or never ends); work duplicated (a key answered with two work ids, plus
  the tenant's work rows in that cell beyond the keys sent) and the
  tenant's rows left in the other cell; the model calls each cell made (and
  the calls the simulated provider saw) against the tenant's ledger rows in
  the final cell; each move's duration (and how long it held the tenant's
  requests); the p99 latency of the requests sent while a move ran against
  that of those sent before the first.
Postgres: ASSAY_DATABASE_URL, else a throwaway server from the PostgreSQL
binaries on the machine.
`

// moveRun is one assay-dev bench move run, as its flags ask.
type moveRun struct {
	duration, latency, moveAfter, settle, wait time.Duration
	rate, webhooks, dups                       float64
	c, pool                                    int
}

func parseMoveRun(args []string) (moveRun, error) {
	var r moveRun
	fs := flag.NewFlagSet("assay-dev bench move", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&r.duration, "duration", time.Minute, "how long the load runs at least")
	fs.Float64Var(&r.rate, "rate", 4, "requests a second, open loop")
	fs.DurationVar(&r.latency, "model-latency", 5*time.Second, "how long the simulated provider takes to answer each call")
	fs.Float64Var(&r.webhooks, "webhooks", 0.25, "the share of requests that are GitHub deliveries")
	fs.Float64Var(&r.dups, "dups", 0.2, "the share of requests that duplicate an earlier one, sent to the other cell")
	fs.DurationVar(&r.moveAfter, "move-after", 5*time.Second, "load before the first move, between the moves and after the second")
	fs.IntVar(&r.c, "c", 64, "requests in flight at most")
	fs.IntVar(&r.pool, "pool", 2, "connections in each service's pool")
	fs.DurationVar(&r.settle, "settle", 2*time.Minute, "how long a move may wait for the tenant to settle (MoveOptions.Settle)")
	fs.DurationVar(&r.wait, "wait", 3*time.Minute, "how long the end of the work and the ledger are waited for")
	if err := fs.Parse(args); err != nil {
		return r, cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, benchMoveUsage)}
	}
	switch {
	case fs.NArg() > 0:
		return r, cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", fs.Arg(0), benchMoveUsage)}
	case r.rate <= 0 || r.rate > 500:
		return r, cli.ConfigError{Err: fmt.Errorf("--rate: %g is not above 0 and at most 500", r.rate)}
	case r.duration < time.Second || r.latency < 0 || r.latency > 5*time.Minute || r.moveAfter < 0:
		return r, cli.ConfigError{Err: errors.New("--duration must be at least 1s, --model-latency from 0 to 5m, --move-after not negative")}
	case r.webhooks < 0 || r.webhooks > 1 || r.dups < 0 || r.dups > 1:
		return r, cli.ConfigError{Err: errors.New("--webhooks and --dups are shares, from 0 to 1")}
	case r.c < 1 || r.pool < 1 || r.settle <= 0 || r.wait <= 0:
		return r, cli.ConfigError{Err: errors.New("-c, --pool, --settle and --wait must be positive")}
	}
	return r, nil
}

// The moved tenant, and the repository its deliveries are about.
const (
	benchMoveTenant = "t1"
	benchMoveRepo   = "shop/move"
)

// callCounter counts the model calls one cell makes, and keeps when each
// call in flight began.
type callCounter struct {
	mu     sync.Mutex
	calls  int64
	seq    int64
	flying map[int64]time.Time
}

func (c *callCounter) begin() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.seq++
	if c.flying == nil {
		c.flying = map[int64]time.Time{}
	}
	c.flying[c.seq] = time.Now()
	return c.seq
}

func (c *callCounter) end(id int64) {
	c.mu.Lock()
	delete(c.flying, id)
	c.mu.Unlock()
}

func (c *callCounter) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// oldest is when the longest call in flight began; false with none.
func (c *callCounter) oldest() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, t := range c.flying {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first, !first.IsZero()
}

// countedModel is a cell's model client, its calls counted.
type countedModel struct {
	next classifier.Completer
	c    *callCounter
}

func (m countedModel) Complete(ctx context.Context, call model.Call) (*model.Reply, error) {
	id := m.c.begin()
	defer m.c.end(id)
	return m.next.Complete(ctx, call)
}

// moveDiffs serves each pull request's diff from the evaluation set, by
// its number.
type moveDiffs struct{}

func (moveDiffs) Diff(_ context.Context, pr ingress.PullRef) (string, error) {
	items := evalset.Items()
	return items[int(pr.Number)%len(items)].Diff, nil
}

// moveReq is one request of the load and its answer.
type moveReq struct {
	webhook bool
	key     int  // the k-th API key, or the k-th delivery
	dup     bool // a duplicate of an earlier request
	cell    int  // the cell sent to
	at      time.Time
	took    time.Duration
	status  int // 0: no answer
	workID  string
}

// name is the request's key: its source and revision, or its delivery.
func (r *moveReq) name() string {
	if r.webhook {
		return fmt.Sprintf("delivery %d", r.key)
	}
	return fmt.Sprintf("api %d", r.key)
}

func (r *moveReq) ok() bool { return r.status/100 == 2 }

// moveSpan is one move the bench made.
type moveSpan struct {
	from, to   string
	start, end time.Time
	report     placement.MoveReport
}

func (m moveSpan) holds(t time.Time) bool {
	return !m.start.IsZero() && !t.Before(m.start) && t.Before(m.end)
}

// moveBench is a run of assay-dev bench move: the region, the tenant and what
// the load did.
type moveBench struct {
	run      moveRun
	cells    []*benchCell
	counters []*callCounter
	model    *sim.Server
	kv       jetstream.KeyValue
	token    string
	secret   string
	client   *http.Client
	reqs     []*moveReq
	moves    [2]moveSpan
	late     int
	wall     time.Duration
}

func benchMove(ctx context.Context, args []string, stdout io.Writer) error {
	run, err := parseMoveRun(args)
	if err != nil {
		return err
	}
	base, ns, stop, err := benchServers(ctx, "move")
	if err != nil {
		return err
	}
	defer stop()
	b := &moveBench{run: run, counters: []*callCounter{{}, {}}, secret: "bench-move-webhook-secret-of-tenant-t1",
		model: sim.New(sim.Options{Constant: true, Latency: run.latency})}
	defer b.model.Close()
	simURL, err := b.model.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	b.cells, err = startRegion(ctx, base, ns.ClientURL(), simURL, 2, run.pool, func(i int, o *cell.Options) {
		o.Ingress.Diffs = moveDiffs{}
		c := b.counters[i]
		o.WrapModel = func(next classifier.Completer) classifier.Completer { return countedModel{next: next, c: c} }
	})
	defer func() {
		for _, bc := range b.cells {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			bc.cell.Stop(sctx)
			cancel()
			bc.db.Close()
			cell.DropDatabases(context.Background(), base, bc.dbName)
		}
	}()
	if err != nil {
		return err
	}
	kv, tokens, err := placeTenants(ctx, b.cells, 1)
	if err != nil {
		return err
	}
	b.kv, b.token = kv, tokens[benchMoveTenant]
	// Every cell knows the tenant's repository and its webhook secret, as
	// every cell knows its token: a delivery is checked where it arrives.
	for _, bc := range b.cells {
		st := bc.cell.Env.Store
		if err := st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubRepository, Key: benchMoveRepo, Tenant: benchMoveTenant}); err != nil {
			return err
		}
		if err := st.SetWebhookSecret(ctx, benchMoveTenant, b.secret); err != nil {
			return err
		}
	}
	b.client = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: run.c}}
	defer b.client.CloseIdleConnections()
	if err := b.load(ctx); err != nil {
		return err
	}
	return b.report(ctx, stdout)
}

// load offers the load and makes the two moves under it; it returns once
// every request has its answer.
func (b *moveBench) load(ctx context.Context) error {
	snap, err := placement.Read(ctx, b.kv, "us")
	if err != nil {
		return err
	}
	home := slices.IndexFunc(b.cells, func(bc *benchCell) bool { return bc.id == snap.CellOf(benchMoveTenant) })
	if home < 0 {
		return fmt.Errorf("tenant %s is placed on %s, not a cell of the bench", benchMoveTenant, snap.CellOf(benchMoveTenant))
	}
	start := time.Now()
	var moveErr error
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		moveErr = b.moveTwice(ctx, start, home)
	}()
	rng := rand.New(rand.NewPCG(54, 6))
	var originals [2][]*moveReq // API, webhook
	var keys [2]int
	slots := make(chan struct{}, b.run.c)
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / b.run.rate * float64(time.Second)))
		if at.Sub(start) >= b.run.duration {
			select {
			case <-moved:
				if moveErr != nil || !at.Before(b.moves[1].end.Add(b.run.moveAfter)) {
					wg.Wait()
					b.wall = time.Since(start)
					if moveErr != nil {
						return moveErr
					}
					return nil
				}
			default:
			}
		}
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		kind := 0
		if rng.Float64() < b.run.webhooks {
			kind = 1
		}
		var r *moveReq
		if sent := originals[kind]; len(sent) > 0 && rng.Float64() < b.run.dups {
			// A duplicate of a recent request, so likely of work in flight,
			// sent to the other cell.
			o := sent[len(sent)-1-rng.IntN(min(len(sent), 16))]
			r = &moveReq{webhook: o.webhook, key: o.key, dup: true, cell: 1 - o.cell}
		} else {
			r = &moveReq{webhook: kind == 1, key: keys[kind], cell: (len(originals[0]) + len(originals[1])) % 2}
			keys[kind]++
			originals[kind] = append(originals[kind], r)
		}
		b.reqs = append(b.reqs, r)
		select {
		case slots <- struct{}{}:
		default:
			b.late++
			slots <- struct{}{}
		}
		wg.Go(func() {
			defer func() { <-slots }()
			b.send(ctx, r)
		})
	}
}

// moveTwice moves the tenant from the cell home to the other once the load
// has run --move-after with a call in flight, and back after as long again.
func (b *moveBench) moveTwice(ctx context.Context, start time.Time, home int) error {
	from, to := home, 1-home
	for n := range b.moves {
		wait := time.Until(start.Add(b.run.moveAfter))
		if n > 0 {
			wait = b.run.moveAfter
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		b.awaitCall(ctx, from)
		m := moveSpan{from: b.cells[from].id, to: b.cells[to].id, start: time.Now()}
		fmt.Fprintf(os.Stderr, "bench move: moving %s from %s to %s, %d calls in flight there\n", benchMoveTenant, m.from, m.to,
			b.counters[from].inFlight())
		var err error
		m.report, err = placement.Move(ctx, b.kv, "us", b.cells[from].cell.Env.Store, b.cells[to].cell.Env.Store, benchMoveTenant,
			m.from, m.to, placement.MoveOptions{Settle: b.run.settle})
		m.end = time.Now()
		if err != nil {
			return fmt.Errorf("move %d of %s from %s to %s: %w", n+1, benchMoveTenant, m.from, m.to, err)
		}
		fmt.Fprintf(os.Stderr, "bench move: moved in %s\n", m.end.Sub(m.start).Round(time.Millisecond))
		b.moves[n] = m
		from, to = to, from
	}
	return nil
}

func (c *callCounter) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.flying)
}

// awaitCall waits (up to 30 s) until a call of cell i has been in flight
// for half the model's latency: a move then starts with calls under way.
func (b *moveBench) awaitCall(ctx context.Context, i int) {
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		if t, ok := b.counters[i].oldest(); ok && time.Since(t) >= b.run.latency/2 {
			return
		}
	}
}

// send makes r's request and records its answer. A 503 is not sent again.
func (b *moveBench) send(ctx context.Context, r *moveReq) {
	url := b.cells[r.cell].cell.URL
	var req *http.Request
	if r.webhook {
		body := moveDelivery(r.key)
		req, _ = http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/webhooks/github", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "pull_request")
		req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("bench-move-%d", r.key))
		req.Header.Set("X-Hub-Signature-256", ingress.Sign(b.secret, body))
	} else {
		it := evalset.Items()[r.key%len(evalset.Items())]
		in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": fmt.Sprintf("move %d", r.key)})
		body, _ := json.Marshal(ingress.SubmitRequest{Contract: "code-review", SourceID: fmt.Sprintf("bench/move#%d", r.key+1),
			Revision: it.Revision, Input: in})
		req, _ = http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/work", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	r.at = time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		r.took = time.Since(r.at)
		return
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	r.took, r.status = time.Since(r.at), resp.StatusCode
	var sub ingress.SubmitResponse // a webhook's answer has its fields
	if r.ok() && json.Unmarshal(raw, &sub) == nil {
		r.workID = sub.WorkID
	}
}

// moveDelivery is the k-th delivery's payload: pull request k+1 of the
// tenant's repository opened, at a head of its own. A redelivery is the
// same bytes.
func moveDelivery(k int) []byte {
	n := int64(k + 1)
	body, _ := json.Marshal(ingress.PullRequestEvent{Action: "opened", Number: n,
		PullRequest: ingress.PullRequest{Number: n, Title: fmt.Sprintf("move %d", n), Head: ingress.GitRef{SHA: fmt.Sprintf("%040x", n)},
			Base: ingress.GitRef{SHA: strings.Repeat("b", 40)}, UpdatedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Second)},
		Repository: ingress.Repository{FullName: benchMoveRepo}})
	return body
}

// moveEnd is what the cells hold of the tenant once the run is over.
type moveEnd struct {
	final, other int               // the cell that serves the tenant, and the other
	states       map[string]string // the tenant's work in the final cell: id to state
	left         int               // the tenant's work rows in the other cell
	ledger       int               // the tenant's ledger rows in the final cell
	settled      bool
}

// ended waits (up to --wait) until every accepted request's work has its
// outcome in the cell that serves the tenant, neither cell holds anything
// unsettled of the tenant, and every attempt has its ledger row.
func (b *moveBench) ended(ctx context.Context, accepted map[string]bool) (moveEnd, error) {
	var e moveEnd
	snap, err := placement.Read(ctx, b.kv, "us")
	if err != nil {
		return e, err
	}
	e.final = slices.IndexFunc(b.cells, func(bc *benchCell) bool { return bc.id == snap.CellOf(benchMoveTenant) })
	if e.final < 0 {
		return e, fmt.Errorf("tenant %s is placed on %s at the end, not a cell of the bench", benchMoveTenant, snap.CellOf(benchMoveTenant))
	}
	e.other = 1 - e.final
	fdb, odb := b.cells[e.final].db, b.cells[e.other].db
	for deadline := time.Now().Add(b.run.wait); ; time.Sleep(200 * time.Millisecond) {
		e.states = map[string]string{}
		rows, err := fdb.Query(ctx, `SELECT id, state FROM work WHERE tenant_id = $1`, benchMoveTenant)
		if err != nil {
			return e, err
		}
		for rows.Next() {
			var id, state string
			if err := rows.Scan(&id, &state); err != nil {
				rows.Close()
				return e, err
			}
			e.states[id] = state
		}
		if err := rows.Err(); err != nil {
			return e, err
		}
		var unledgered int
		if err := fdb.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM ledger WHERE tenant_id = $1),
				(SELECT count(*) FROM attempts a WHERE a.tenant_id = $1 AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id))`,
			benchMoveTenant).Scan(&e.ledger, &unledgered); err != nil {
			return e, err
		}
		if err := odb.QueryRow(ctx, `SELECT count(*) FROM work WHERE tenant_id = $1`, benchMoveTenant).Scan(&e.left); err != nil {
			return e, err
		}
		e.settled = unledgered == 0
		for id := range accepted {
			if st, ok := e.states[id]; !ok || st == outcome.Queued || st == outcome.Running {
				e.settled = false
			}
		}
		for _, i := range []int{e.final, e.other} {
			u, err := b.cells[i].cell.Env.Store.TenantUnsettled(ctx, benchMoveTenant)
			if err != nil {
				return e, err
			}
			e.settled = e.settled && u.Zero()
		}
		if e.settled || time.Now().After(deadline) {
			return e, nil
		}
	}
}

// report waits for the end of the work and prints the run's line.
func (b *moveBench) report(ctx context.Context, w io.Writer) error {
	accepted := map[string]bool{}
	ids := map[string]map[string]bool{} // key to the work ids it was answered with
	keys := map[string]bool{}
	var during, duringBad, bad int
	var before, inMoves []time.Duration
	for _, r := range b.reqs {
		keys[r.name()] = true
		if r.ok() && r.workID != "" {
			accepted[r.workID] = true
			if ids[r.name()] == nil {
				ids[r.name()] = map[string]bool{}
			}
			ids[r.name()][r.workID] = true
		}
		if !r.ok() {
			bad++
		}
		switch {
		case b.moves[0].holds(r.at) || b.moves[1].holds(r.at):
			during++
			inMoves = append(inMoves, r.took)
			if !r.ok() {
				duringBad++
			}
		case r.at.Before(b.moves[0].start):
			before = append(before, r.took)
		}
	}
	e, err := b.ended(ctx, accepted)
	if err != nil {
		return err
	}
	if !e.settled {
		fmt.Fprintf(os.Stderr, "bench move: the work or the ledger had not caught up within --wait %s\n", b.run.wait)
	}
	var lost int
	for id := range accepted {
		if st, ok := e.states[id]; !ok || st == outcome.Queued || st == outcome.Running {
			lost++
		}
	}
	var dup int
	for _, set := range ids {
		if len(set) > 1 {
			dup++
		}
	}
	dup += max(0, len(e.states)-len(keys))
	var webhooks, dups int
	for _, r := range b.reqs {
		if r.webhook {
			webhooks++
		}
		if r.dup {
			dups++
		}
	}
	n := len(b.reqs)
	fmt.Fprintf(w, "bench move: tenant %s of region us moved %s → %s → %s under %g requests/s for %s: %d requests (%d webhook deliveries, %d duplicates sent to the other cell, %d late), model latency %s\n",
		benchMoveTenant, b.moves[0].from, b.moves[0].to, b.moves[1].to, b.run.rate, b.wall.Round(time.Second), n, webhooks, dups, b.late, b.run.latency)
	final, other := b.cells[e.final].id, b.cells[e.other].id
	fmt.Fprintf(w, "during the moves %d requests, %d non-2xx (%d of %d in all); work lost %d, duplicated %d (%d rows left in %s); "+
		"model calls %s %d + %s %d = %d (the sim saw %d) against %d ledger rows in %s; move 1 %s (held %s), move 2 %s (held %s); "+
		"p99 %s during the moves against %s before\n",
		during, duringBad, bad, n, lost, dup, e.left, other,
		b.cells[0].id, b.counters[0].count(), b.cells[1].id, b.counters[1].count(), b.counters[0].count()+b.counters[1].count(),
		b.model.Stats().Total, e.ledger, final,
		b.moves[0].end.Sub(b.moves[0].start).Round(time.Millisecond), b.moves[0].report.Held.Round(time.Millisecond),
		b.moves[1].end.Sub(b.moves[1].start).Round(time.Millisecond), b.moves[1].report.Held.Round(time.Millisecond),
		p99(inMoves), p99(before))
	return nil
}

// p99 is the 99th percentile of ds (nearest rank), 0s with none.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Ceil(0.99*float64(len(s))))-1].Round(time.Millisecond)
}
