package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/admission"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

const benchUsage = `usage: assay-dev bench goodput [--scenarios 1,2,3,4,5,6,7,8,9] [--quick]

Runs each scenario against the simulated provider over real JetStream
(embedded) and Postgres (ASSAY_DATABASE_URL, else a throwaway cluster),
once with the adaptive classifier and once with a baseline of fixed
concurrency and naive retry, and prints a table. Scenarios 6-8 measure
overload shedding, fair share and the shared ingress rate (each against
its own contrast) and scenario 9 a steady tenant's answers beside an
invalid-batch flood (sent with curl), each in a table of its own. The
default is 1-8. --quick shortens every
load phase tenfold, to check that the command works.
`

// benchScenario is one provider and one offered load.
type benchScenario struct {
	n     int
	name  string
	cap   sim.Capacity
	load  time.Duration
	avgOf func(time.Duration) float64 // provider capacity averaged over the load window, req/s
	// drive offers the load; it returns when the last request was made.
	drive func(ctx context.Context, r *benchRun) error
	// reference also runs the adaptive classifier without the batch sweep.
	reference bool
	// modes, when set, are the runs instead of adaptive and baseline.
	modes []string
}

// benchRun is one scenario against one classifier.
type benchRun struct {
	sc       *benchScenario
	mode     string // adaptive, baseline, reference
	cell     *cell.Cell
	sim      *sim.Server
	token    string
	client   *http.Client
	batch    bool // the scenario's batch sweep runs (false in the reference run)
	start    time.Time
	offered  atomic.Int64
	refused  atomic.Int64 // ingress 429s (tenant rate; set high, so 0 expected)
	failures atomic.Int64 // requests that did not get 200/202/429
}

// benchResult is one row of the table.
type benchResult struct {
	Scenario, Mode                  string
	Capacity, Goodput               float64
	Accepted, Offered               int64
	Calls, Throttled, Early         int64
	QueueP50, QueueP95, E2EP50      map[string]time.Duration
	E2EP95                          map[string]time.Duration
	Outcomes                        map[string]int
	InFlight                        int
	Makespan                        time.Duration
	LimitAtEnd, LimitMin, LimitMax  int
	PermitWaits                     int           // interactive permits granted after a wait
	PermitWaited                    time.Duration // their total wait
	IngressRefused, RequestFailures int64
}

func benchCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "pipeline" {
		return benchPipeline(ctx, args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "parts" {
		return benchParts(ctx, args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "cells" {
		return benchCells(ctx, args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "move" {
		return benchMove(ctx, args[1:], stdout)
	}
	if len(args) == 0 || args[0] != "goodput" {
		return tool.UnknownSub("bench", args)
	}
	fs := flag.NewFlagSet("assay-dev bench goodput", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	which := fs.String("scenarios", "1,2,3,4,5,6,7,8", "comma-separated scenario numbers")
	quick := fs.Bool("quick", false, "shorten every load phase tenfold")
	logTo := fs.String("log", "", "write the cells' JSON logs (decisions included) to this file")
	if err := fs.Parse(args[1:]); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, benchUsage)}
	}
	want := map[int]bool{}
	for _, f := range strings.Split(*which, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 9 {
			return cli.ConfigError{Err: fmt.Errorf("--scenarios: %q is not a list of 1-9", *which)}
		}
		want[n] = true
	}
	scale := 1.0
	if *quick {
		scale = 0.1
	}
	base := os.Getenv("ASSAY_DATABASE_URL")
	var pg *devpg.Cluster
	if base == "" {
		var err error
		if pg, err = devpg.Start(ctx, ""); err != nil {
			return fmt.Errorf("throwaway postgres (set ASSAY_DATABASE_URL to use a running server): %w", err)
		}
		defer func() { _ = pg.Stop() }()
		base = pg.URL("postgres")
	}
	logw, closeLog, err := benchLogFile(*logTo)
	if err != nil {
		return err
	}
	defer closeLog()
	var results []benchResult
	for _, sc := range benchScenarios(scale) {
		if !want[sc.n] {
			continue
		}
		modes := []string{"adaptive", "baseline"}
		if sc.modes != nil {
			modes = sc.modes
		}
		if sc.reference {
			modes = append(modes, "reference")
		}
		for _, mode := range modes {
			fmt.Fprintf(os.Stderr, "bench: scenario %d (%s), %s…\n", sc.n, sc.name, mode)
			res, err := runBench(ctx, base, sc, mode, logw)
			if err != nil {
				return fmt.Errorf("scenario %d %s: %w", sc.n, mode, err)
			}
			results = append(results, res)
			printBenchRow(os.Stderr, res)
		}
	}
	printBenchTable(stdout, results)
	return benchShed(ctx, base, want, scale, logw, results, stdout)
}

func benchScenarios(scale float64) []*benchScenario {
	d := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	fixed100 := sim.Latency{Kind: sim.LatencyFixed, Base: 100 * time.Millisecond}
	flat := func(c float64) func(time.Duration) float64 { return func(time.Duration) float64 { return c } }
	return []*benchScenario{
		{n: 1, name: "100 req/s bucket, 100 ms, offered 3x", load: d(60),
			cap: sim.Capacity{Rate: 100, Burst: 10, Latency: fixed100}, avgOf: flat(100),
			drive: func(ctx context.Context, r *benchRun) error {
				return r.offer(ctx, 300, r.sc.load, "interactive", r.moderation("s1"))
			}},
		{n: 2, name: "5 concurrent x 100 ms (50 req/s), offered 2x", load: d(30),
			cap: sim.Capacity{Concurrency: 5, Latency: fixed100}, avgOf: flat(50),
			drive: func(ctx context.Context, r *benchRun) error {
				return r.offer(ctx, 100, r.sc.load, "interactive", r.moderation("s2"))
			}},
		{n: 3, name: "100 req/s halving at 1/3 and back at 2/3, offered 2x", load: d(60),
			cap: sim.Capacity{Rate: 100, Burst: 10, Latency: fixed100,
				Steps: []sim.Step{{At: d(20), Factor: 0.5}, {At: d(40), Factor: 1}}},
			avgOf: flat((100 + 50 + 100) / 3.0),
			drive: func(ctx context.Context, r *benchRun) error {
				return r.offer(ctx, 200, r.sc.load, "interactive", r.moderation("s3"))
			}},
		{n: 4, name: "burst probe: 90 events for 40 PRs in 3 s, 4 concurrent x 500 ms", load: d(3),
			cap:   sim.Capacity{Concurrency: 4, Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 500 * time.Millisecond}},
			avgOf: flat(8), drive: burstProbe},
		{n: 5, name: "2,000-item batch sweep under interactive 5 req/s", load: d(25),
			cap: sim.Capacity{Rate: 100, Burst: 10, Latency: fixed100}, avgOf: flat(100), reference: true,
			drive: func(ctx context.Context, r *benchRun) error {
				var wg sync.WaitGroup
				var batchErr error
				if r.batch {
					wg.Go(func() {
						batchErr = r.offer(ctx, 400, time.Duration(float64(2000)/400*float64(time.Second)), "batch", r.moderation("s5-batch"))
					})
				}
				err := r.offer(ctx, 5, r.sc.load, "interactive", r.moderation("s5-interactive"))
				wg.Wait()
				return errors.Join(err, batchErr)
			}},
		{n: 6, name: "100 req/s bucket, 100 ms, offered 3x: shed at ingress, or queued", load: d(60),
			cap: sim.Capacity{Rate: 100, Burst: 10, Latency: fixed100}, avgOf: flat(100), modes: []string{"adaptive", "unshed"},
			drive: func(ctx context.Context, r *benchRun) error {
				return r.offer(ctx, 300, r.sc.load, "interactive", r.moderation("s6"))
			}},
	}
}

func runBench(ctx context.Context, baseDB string, sc *benchScenario, mode string, logw io.Writer) (benchResult, error) {
	res := benchResult{Scenario: fmt.Sprintf("%d", sc.n), Mode: mode}
	ccfg := classifier.Config{Concurrency: 32, CallTimeout: 10 * time.Second}
	var wrap func(classifier.Completer) classifier.Completer
	if mode == "baseline" {
		ccfg = classifier.Config{Concurrency: 16, FixedConcurrency: true, CallTimeout: 10 * time.Second}
		wrap = func(c classifier.Completer) classifier.Completer { return naiveRetry{next: c} }
	}
	bed, err := startBenchBed(ctx, baseDB, cell.Options{
		Log:        benchLogger(logw, sc.n, mode),
		Classifier: ccfg, WrapModel: wrap,
		Ingress: ingress.Config{InteractiveDeadline: 8 * time.Second, SweepEvery: time.Second, LeaseGrace: 2 * time.Second,
			Shed: ingress.ShedConfig{Off: mode == "unshed"}},
	}, []string{"acme"})
	if err != nil {
		return res, err
	}
	defer bed.close()
	c, s, db, tok := bed.cell, bed.sim, bed.db, bed.tokens["acme"]
	r := &benchRun{sc: sc, mode: mode, cell: c, sim: s, token: tok, batch: mode != "reference",
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}}}
	if err := s.SetCapacity(sc.cap); err != nil {
		return res, err
	}
	lim := c.Classifier.Limiter()
	res.LimitMin, res.LimitMax = lim.Limit(), lim.Limit()
	sampleCtx, stopSample := context.WithCancel(ctx)
	defer stopSample()
	sampleDone := sampleLimit(sampleCtx, lim, &res)
	r.start = time.Now()
	var dbStart time.Time
	if err := db.QueryRow(ctx, `SELECT now()`).Scan(&dbStart); err != nil {
		return res, err
	}
	if err := sc.drive(ctx, r); err != nil {
		stopSample()
		return res, err
	}
	loadEnd := time.Now()
	if err := awaitOutcomes(ctx, db, &res); err != nil {
		return res, err
	}
	stopSample()
	<-sampleDone
	res.LimitAtEnd = lim.Limit()
	ls := lim.Stats()
	res.PermitWaits, res.PermitWaited = ls.PermitWaits.Interactive, ls.PermitWaited.Interactive
	window := loadEnd.Sub(r.start)
	res.Capacity = sc.avgOf(window)
	res.Offered, res.IngressRefused, res.RequestFailures = r.offered.Load(), r.refused.Load(), r.failures.Load()
	if err := benchMeasure(ctx, db, dbStart, window, &res); err != nil {
		return res, err
	}
	if sc.n == 5 {
		if err := sweepGoodput(ctx, db, dbStart, &res); err != nil {
			return res, err
		}
	}
	st := s.Stats()
	res.Calls, res.Throttled, res.Early = st.Total, st.Throttled, st.Early
	for _, ts := range st.Tenants {
		res.Throttled += ts.RateLimited
	}
	return res, nil
}

// sampleLimit reads lim's limit every 50 ms into res's LimitMin and
// LimitMax until ctx ends, and closes the channel it returns then.
func sampleLimit(ctx context.Context, lim *admission.Limiter, res *benchResult) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				l := lim.Limit()
				res.LimitMin, res.LimitMax = min(res.LimitMin, l), max(res.LimitMax, l)
			}
		}
	}()
	return done
}

// awaitOutcomes waits for quiescence: every work item has its outcome
// (interactive work past its deadline is expired by the sweeper), or two
// minutes pass. It leaves the work still in flight in res.InFlight.
func awaitOutcomes(ctx context.Context, db *pgxpool.Pool, res *benchResult) error {
	quiet := time.Now().Add(2 * time.Minute)
	for time.Now().Before(quiet) {
		var err error
		if res.InFlight, err = countQ(ctx, db, `SELECT count(*) FROM work WHERE state IN ('queued', 'running')`); err != nil {
			return err
		}
		if res.InFlight == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// sweepGoodput sets scenario 5's goodput, over the time from dbStart until
// the sweep's last acceptance.
func sweepGoodput(ctx context.Context, db *pgxpool.Pool, dbStart time.Time, res *benchResult) error {
	var n int
	var span float64
	if err := db.QueryRow(ctx, `WITH b AS (SELECT max(updated_at) AS last FROM work
			WHERE lane = 'batch' AND state = 'accepted')
		SELECT count(*), coalesce(extract(epoch FROM (SELECT last FROM b) - $1::timestamptz), 0)
		FROM work WHERE state = 'accepted' AND updated_at <= (SELECT last FROM b)`, dbStart).Scan(&n, &span); err != nil {
		return err
	}
	if span > 0 {
		res.Goodput, res.Makespan = float64(n)/span, time.Duration(span*float64(time.Second))
	}
	return nil
}

// benchBed is one cell for a benchmark run: an embedded nats-server, a
// fresh database on the server of base, the simulated provider, the
// benchmark's own pool on the database, and tenants homed in the cell whose
// rate no bucket refuses.
type benchBed struct {
	cell   *cell.Cell
	sim    *sim.Server
	db     *pgxpool.Pool
	dbName string
	tokens map[string]string // by tenant
	undo   []func()
}

// close stops what startBenchBed started, last first.
func (b *benchBed) close() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
}

// startBenchBed starts the cell of region us with o (its Config filled in
// here) and seeds tenants.
func startBenchBed(ctx context.Context, base string, o cell.Options, tenants []string, simOpts ...sim.Options) (bed *benchBed, err error) {
	b := &benchBed{tokens: map[string]string{}}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	dir, err := os.MkdirTemp("", "assay-bench-")
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() { os.RemoveAll(dir) })
	ns, err := cell.StartNATS(dir)
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() { ns.Shutdown(); ns.WaitForShutdown() })
	b.dbName = fmt.Sprintf("assay_bench_%d", time.Now().UnixNano())
	dbURL, drop, err := benchDB(ctx, base, b.dbName)
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, drop)
	var so sim.Options
	if len(simOpts) > 0 {
		so = simOpts[0]
	}
	b.sim = sim.New(so)
	b.undo = append(b.undo, func() { _ = b.sim.Close() })
	simURL, err := b.sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	o.Config = config.Config{Regions: config.DefaultRegions, Region: "us", Cell: "us", Installation: event.DefaultInstallation,
		DatabaseURL: dbURL, NATSURL: ns.ClientURL(), ModelBaseURL: sim.APIBase(simURL), Model: "assay-sim-1", HTTPAddr: "127.0.0.1:0",
		DatabasePool: o.Config.DatabasePool}
	if b.cell, err = cell.Start(ctx, o); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b.cell.Stop(sctx)
	})
	if b.db, err = pgxpool.New(ctx, dbURL); err != nil { // the benchmark's own reads of the record
		return nil, err
	}
	b.undo = append(b.undo, b.db.Close)
	var seeds []store.TenantSeed
	for _, t := range tenants {
		b.tokens[t] = store.NewToken()
		seeds = append(seeds, store.TenantSeed{ID: t, HomeRegion: "us", Token: b.tokens[t]})
	}
	if err := b.cell.Env.Store.SeedTenants(ctx, seeds); err != nil {
		return nil, err
	}
	// Load starts once ingress knows the cell's capacity.
	for end := time.Now().Add(20 * time.Second); !b.cell.Ingress.CapacityKnown(); {
		if time.Now().After(end) {
			return nil, errors.New("ingress read no capacity report within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, t := range tenants {
		if err := b.cell.Env.Store.SetRate(ctx, t, 10_000_000, 100_000); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// benchLogger logs the cell's decisions to w, or nothing (not even
// formatting a line) when w is io.Discard.
func benchLogger(w io.Writer, scenario int, mode string) *slog.Logger {
	if w == io.Discard {
		return slog.New(slog.DiscardHandler)
	}
	return telemetry.NewLogger(w, "bench", "us", slog.LevelInfo).With("scenario", scenario, "mode", mode)
}

// benchLogFile is where --log sends the cells' JSON logs: the file named,
// or nowhere.
func benchLogFile(path string) (io.Writer, func(), error) {
	if path == "" {
		return io.Discard, func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, cli.ConfigError{Err: fmt.Errorf("--log: %w", err)}
	}
	return f, func() { f.Close() }, nil
}

// benchDB creates a fresh database on the server of base and returns its
// URL and a function that drops it. Each service opens its own pool on it
// (ASSAY_DATABASE_POOL's default, or --pool), as in assay-dev dev; the URL
// names no pool size of its own, which every pool would take.
func benchDB(ctx context.Context, base, name string) (string, func(), error) {
	dbURL, err := cell.CreateDatabase(ctx, base, name)
	if err != nil {
		return "", nil, err
	}
	return dbURL, func() { cell.DropDatabases(context.Background(), base, name) }, nil
}

func countQ(ctx context.Context, db *pgxpool.Pool, q string, args ...any) (int, error) {
	var n int
	err := db.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// benchMeasure reads the figures of a run from the cell's database: the
// record, not the load generator's view of it.
func benchMeasure(ctx context.Context, db *pgxpool.Pool, dbStart time.Time, window time.Duration, res *benchResult) error {
	inWindow, err := countQ(ctx, db, `SELECT count(*) FROM work WHERE state = 'accepted'
		AND updated_at <= $1::timestamptz + $2 * interval '1 microsecond'`, dbStart, window.Microseconds())
	if err != nil {
		return err
	}
	res.Goodput = float64(inWindow) / window.Seconds()
	var makespan float64
	if err := db.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM max(updated_at) - $1::timestamptz), 0)
		FROM work WHERE state = 'accepted'`, dbStart).Scan(&res.Accepted, &makespan); err != nil {
		return err
	}
	res.Makespan = time.Duration(makespan * float64(time.Second))
	res.Outcomes = map[string]int{}
	rows, err := db.Query(ctx, `SELECT state, count(*) FROM work GROUP BY state`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return err
		}
		res.Outcomes[s] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	res.QueueP50, res.QueueP95 = map[string]time.Duration{}, map[string]time.Duration{}
	res.E2EP50, res.E2EP95 = map[string]time.Duration{}, map[string]time.Duration{}
	// Queue wait: from the work row's creation to its first claim.
	rows, err = db.Query(ctx, `SELECT w.lane,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at)),
			percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at))
		FROM work w JOIN (SELECT work_id, min(started_at) AS first FROM attempts GROUP BY work_id) a ON a.work_id = w.id
		GROUP BY w.lane`)
	if err != nil {
		return err
	}
	if err := scanPercentiles(rows, res.QueueP50, res.QueueP95); err != nil {
		return err
	}
	rows, err = db.Query(ctx, `SELECT lane,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)),
			percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at))
		FROM work WHERE state = 'accepted' GROUP BY lane`)
	if err != nil {
		return err
	}
	return scanPercentiles(rows, res.E2EP50, res.E2EP95)
}

func scanPercentiles(rows pgx.Rows, p50, p95 map[string]time.Duration) error {
	defer rows.Close()
	for rows.Next() {
		var lane string
		var a, b float64
		if err := rows.Scan(&lane, &a, &b); err != nil {
			return err
		}
		p50[lane], p95[lane] = time.Duration(a*float64(time.Second)), time.Duration(b*float64(time.Second))
	}
	return rows.Err()
}

// moderation makes the i-th request of a load: moderation of a short text,
// each its own source.
func (r *benchRun) moderation(prefix string) func(i int) ingress.SubmitRequest {
	return func(i int) ingress.SubmitRequest {
		in, _ := json.Marshal(map[string]string{"text": fmt.Sprintf("comment %d of %s: the checkout page is slow today", i, prefix)})
		return ingress.SubmitRequest{Contract: "moderation", SourceID: fmt.Sprintf("%s-%d", prefix, i), Revision: "1", Input: in}
	}
}

// offer submits at rate per second for d, open loop: a slow answer does
// not slow the offered load.
func (r *benchRun) offer(ctx context.Context, rate float64, d time.Duration, lane string, mk func(int) ingress.SubmitRequest) error {
	return openLoop(ctx, rate, d, func(i int) {
		req := mk(i)
		req.Lane = lane
		r.submit(ctx, req)
	})
}

// openLoop runs send(i) for i in [0, rate·d) at rate per second from now,
// each on its own goroutine (at most 256 at once), and waits for them: the
// load is offered on its schedule whatever the answers take.
func openLoop(ctx context.Context, rate float64, d time.Duration, send func(i int)) error {
	n := int(rate * d.Seconds())
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 256)
	for i := range n {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if wait := time.Until(at); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			send(i)
		})
	}
	return nil
}

func (r *benchRun) submit(ctx context.Context, req ingress.SubmitRequest) {
	r.offered.Add(1)
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.cell.URL+"/v1/work", bytes.NewReader(body))
	hr.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := r.client.Do(hr)
	if err != nil {
		r.failures.Add(1)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusAccepted, http.StatusOK:
	case http.StatusTooManyRequests:
		r.refused.Add(1)
	default:
		r.failures.Add(1)
	}
}

// burstProbe sends 90 events for 40 pull requests within 3 s: each opens
// once, 25 are delivered twice, and 25 are force-pushed while their first
// review may be running.
func burstProbe(ctx context.Context, r *benchRun) error {
	items := evalset.Items()
	type ev struct {
		at  time.Duration
		req ingress.SubmitRequest
	}
	var evs []ev
	span := r.sc.load
	for i := range 40 {
		it := items[i%len(items)]
		in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": fmt.Sprintf("PR %d", i)})
		open := ingress.SubmitRequest{Contract: "code-review", SourceID: fmt.Sprintf("shop/checkout#%d", 100+i),
			Revision: strings.Repeat("a", 40), Input: in, Lane: "interactive", DeadlineSeconds: 120}
		at := time.Duration(i) * span / 80
		evs = append(evs, ev{at, open})
		if i < 25 {
			evs = append(evs, ev{at + span/10, open}) // redelivered
		}
		if i >= 15 {
			push := open
			push.Revision = strings.Repeat("b", 40)
			evs = append(evs, ev{at + span/2, push}) // force-pushed mid-review
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return int(a.at - b.at) })
	start := time.Now()
	var wg sync.WaitGroup
	for _, e := range evs {
		if wait := time.Until(start.Add(e.at)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		wg.Go(func() { r.submit(ctx, e.req) })
	}
	wg.Wait()
	return nil
}

// naiveRetry is the baseline's client: on a 429 it waits a fixed 100 ms,
// holding its concurrency slot, and tries again up to three times,
// ignoring Retry-After; the classifier then sees no Retry-After either.
type naiveRetry struct{ next classifier.Completer }

func (n naiveRetry) Complete(ctx context.Context, call model.Call) (*model.Reply, error) {
	for i := 0; ; i++ {
		rep, err := n.next.Complete(ctx, call)
		var me *model.Error
		if !errors.As(err, &me) || me.Kind != model.KindRateLimited {
			return rep, err
		}
		me.RetryAfter = 0
		if i == 3 {
			return rep, err
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return rep, err
		}
	}
}

func pct(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f %%", 100*a/b)
}

func ms(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%d", d.Milliseconds())
}

func outcomesText(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func printBenchRow(w io.Writer, r benchResult) {
	fmt.Fprintf(w, "  goodput %.1f/s of %.1f (%s), accepted %d of %d offered, calls %d, 429s %d (%s), early %d, in flight %d, limit %d..%d end %d\n  outcomes: %s\n",
		r.Goodput, r.Capacity, pct(r.Goodput, r.Capacity), r.Accepted, r.Offered, r.Calls, r.Throttled,
		pct(float64(r.Throttled), float64(r.Calls)), r.Early, r.InFlight, r.LimitMin, r.LimitMax, r.LimitAtEnd, outcomesText(r.Outcomes))
}

func printBenchTable(w io.Writer, rs []benchResult) {
	fmt.Fprintln(w, "| # | classifier | goodput / capacity | 429s / calls | early calls | calls / accepted | queue wait p50 / p95 ms (interactive; batch) | end-to-end p50 / p95 ms (interactive; batch) | outcomes | in flight at end | limit min..max | interactive permit waits (n, mean ms) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		perAccepted := "–"
		if r.Accepted > 0 {
			perAccepted = fmt.Sprintf("%.2f", float64(r.Calls)/float64(r.Accepted))
		}
		lanes := func(p50, p95 map[string]time.Duration) string {
			s := ms(p50["interactive"]) + " / " + ms(p95["interactive"])
			if _, ok := p50["batch"]; ok {
				s += "; " + ms(p50["batch"]) + " / " + ms(p95["batch"])
			}
			return s
		}
		good := fmt.Sprintf("%.1f / %.1f = %s", r.Goodput, r.Capacity, pct(r.Goodput, r.Capacity))
		switch r.Scenario {
		case "4":
			good = fmt.Sprintf("all %d accepted in %.1f s", r.Accepted, r.Makespan.Seconds())
		case "5":
			good += fmt.Sprintf(" (over %.1f s)", r.Makespan.Seconds())
		}
		waits := "0"
		if r.PermitWaits > 0 {
			waits = fmt.Sprintf("%d, mean %.1f", r.PermitWaits, float64(r.PermitWaited.Microseconds())/1000/float64(r.PermitWaits))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d / %d = %s | %d | %s | %s | %s | %s | %d | %d..%d | %s |\n",
			r.Scenario, r.Mode, good, r.Throttled, r.Calls, pct(float64(r.Throttled), float64(r.Calls)), r.Early,
			perAccepted, lanes(r.QueueP50, r.QueueP95), lanes(r.E2EP50, r.E2EP95), outcomesText(r.Outcomes),
			r.InFlight, r.LimitMin, r.LimitMax, waits)
	}
}
