package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

const benchPipeUsage = `usage: assay-dev bench pipeline [-n 20000] [-c 8,32] [--runs 1] [--peer DIR] [--answer constant|reviewer]
       [--tenants 4] [--pool N] [--rate R] [--statements] [--cpuprofile FILE] [--log FILE]

N distinct code reviews posted through HTTP ingress by C keep-alive clients
for the tenants in turn, the simulated model answering at once (constant:
each distinct diff reviewed once and answered from that review; reviewer:
every call reviewed), until every item is accepted and ledgered; one cell on
an embedded nats-server and ASSAY_DATABASE_URL's server (else a throwaway
cluster). Per run: items/s, created -> accepted p50/p99, Postgres commits,
statements (each service's pool counts what it sends, BEGIN and COMMIT
included) and WAL bytes per item, JetStream messages per item, and the cores
this process and Postgres used. --peer DIR runs the River build in DIR
(go run . -n N -c C) after each assay run, on the same Postgres, and prints
the ratio. After each run it prints to stderr when the last item was accepted
and ledgered, and the three slowest items: how long each waited for its
claim, its answer and its acceptance. --log FILE keeps the cell's JSON logs.
--rate R posts open loop instead: the i-th item at i/R seconds whatever the
earlier ones wait for, at most C posts in flight (the latency at a load
below capacity; the River build has no open loop, so not with --peer).
`

// pipeResult is one run of one system.
type pipeResult struct {
	System          string
	C, N            int
	Wall            time.Duration
	ItemsPerSec     float64
	P50, P99        time.Duration
	CommitsPerItem  float64
	WALKBPerItem    float64
	MessagesPerItem float64
	StmtsPerItem    float64
	StmtsBy         map[string]float64 // per service
	ProcCores       float64
	PGCores         float64
	// WorkUpdates and WorkHOT are the work table's row updates in the run
	// and how many of them were heap-only (no index touched).
	WorkUpdates, WorkHOT int64
	// Rate is the open loop's items a second (0: a closed loop of C).
	Rate float64
}

// pipeFlags are bench pipeline's flags.
type pipeFlags struct {
	n, runs, pool, tenants int
	cs, peer, answer       string
	cpuProfile, logTo      string
	statements             bool
	rate                   float64
	clients                []int // -c, read
}

// parsePipeFlags reads bench pipeline's flags and checks them.
func parsePipeFlags(args []string) (*pipeFlags, error) {
	f := &pipeFlags{}
	fs := flag.NewFlagSet("assay-dev bench pipeline", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&f.n, "n", 20000, "distinct work items to post")
	fs.StringVar(&f.cs, "c", "8,32", "concurrent clients, comma separated: one series each")
	fs.IntVar(&f.runs, "runs", 1, "runs per client count")
	fs.StringVar(&f.peer, "peer", "", "directory of the River build to run beside it")
	fs.BoolVar(&f.statements, "statements", false, "print each service's statements per item to stderr after each run")
	fs.IntVar(&f.pool, "pool", 0, "connections in each service's pool (0: ASSAY_DATABASE_POOL's default)")
	fs.StringVar(&f.answer, "answer", "constant", "the simulated model: constant (each diff reviewed once, then answered from that) or reviewer (every call reviewed)")
	fs.IntVar(&f.tenants, "tenants", 4, "tenants the items are posted for, in turn")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of this process over the assay runs to this file")
	fs.StringVar(&f.logTo, "log", "", "write the cell's JSON logs (decisions included) to this file")
	fs.Float64Var(&f.rate, "rate", 0, "post open loop at this many items a second (C bounds the posts in flight) instead of C clients in a closed loop")
	if err := fs.Parse(args); err != nil {
		return nil, cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, benchPipeUsage)}
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	return f, nil
}

// validate checks the flags and reads -c's client counts.
func (f *pipeFlags) validate() error {
	for _, s := range strings.Split(f.cs, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 || c > 1024 {
			return cli.ConfigError{Err: fmt.Errorf("-c: %q is not a list of client counts from 1 to 1024", f.cs)}
		}
		f.clients = append(f.clients, c)
	}
	if f.answer != "constant" && f.answer != "reviewer" {
		return cli.ConfigError{Err: fmt.Errorf("--answer: %q is neither constant nor reviewer", f.answer)}
	}
	if f.tenants < 1 || f.tenants > 100_000 {
		return cli.ConfigError{Err: fmt.Errorf("--tenants: %d is not from 1 to 100000", f.tenants)}
	}
	if f.n < 1 || f.runs < 1 {
		return cli.ConfigError{Err: errors.New("-n and --runs must be positive")}
	}
	if f.rate < 0 || f.rate > 100_000 {
		return cli.ConfigError{Err: fmt.Errorf("--rate: %g is not from 0 to 100000 items a second", f.rate)}
	}
	if f.rate > 0 && f.peer != "" {
		return cli.ConfigError{Err: errors.New("--rate with --peer: the River build posts in a closed loop only; run it on its own with -c")}
	}
	if f.peer != "" {
		if st, err := os.Stat(filepath.Join(f.peer, "go.mod")); err != nil || st.IsDir() {
			return cli.ConfigError{Err: fmt.Errorf("--peer: %s holds no go.mod", f.peer)}
		}
	}
	return nil
}

func benchPipeline(ctx context.Context, args []string, stdout io.Writer) error {
	f, err := parsePipeFlags(args)
	if err != nil {
		return err
	}
	base, stop, err := benchPostgres(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if f.cpuProfile != "" {
		prof, err := os.Create(f.cpuProfile)
		if err != nil {
			return cli.ConfigError{Err: fmt.Errorf("--cpuprofile: %w", err)}
		}
		defer prof.Close()
		if err := pprof.StartCPUProfile(prof); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	logw, closeLog, err := benchLogFile(f.logTo)
	if err != nil {
		return err
	}
	defer closeLog()
	var all []pipeResult
	for _, c := range f.clients {
		for run := range f.runs {
			fmt.Fprintf(os.Stderr, "bench pipeline: assay, n=%d c=%d, run %d…\n", f.n, c, run+1)
			r, err := runPipeline(ctx, base, pipeRun{n: f.n, c: c, pool: f.pool, statements: f.statements,
				constant: f.answer == "constant", tenants: f.tenants, log: logw, rate: f.rate})
			if err != nil {
				return fmt.Errorf("assay c=%d: %w", c, err)
			}
			all = append(all, r)
			if f.peer != "" {
				fmt.Fprintf(os.Stderr, "bench pipeline: river, n=%d c=%d, run %d…\n", f.n, c, run+1)
				p, err := runPeer(ctx, f.peer, f.n, c)
				if err != nil {
					return fmt.Errorf("peer c=%d: %w", c, err)
				}
				all = append(all, p)
			}
		}
	}
	printPipe(stdout, all)
	return nil
}

// benchPostgres is ASSAY_DATABASE_URL's server, or a throwaway cluster.
func benchPostgres(ctx context.Context) (string, func(), error) {
	if base := os.Getenv("ASSAY_DATABASE_URL"); base != "" {
		return base, func() {}, nil
	}
	pg, err := devpg.Start(ctx, "")
	if err != nil {
		return "", nil, fmt.Errorf("throwaway postgres (set ASSAY_DATABASE_URL to use a running server): %w", err)
	}
	return pg.URL("postgres"), func() { _ = pg.Stop() }, nil
}

// dispatch calls post for 0..n-1 and returns when every call has: with
// rate 0 from c goroutines, each taking the next i when it is done (a
// closed loop); with a rate, the i-th call starting at i/rate seconds in a
// goroutine of its own, at most c at once (an open loop). late is how many
// open-loop calls started after their time, all c being in flight.
func dispatch(n, c int, rate float64, post func(i int)) (late int64) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if rate <= 0 {
		var next atomic.Int64
		for range c {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					post(i)
				}
			})
		}
		return 0
	}
	slots := make(chan struct{}, c)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
		select {
		case slots <- struct{}{}:
		default:
			late++
			slots <- struct{}{}
		}
		wg.Go(func() {
			defer func() { <-slots }()
			post(i)
		})
	}
	return late
}

// pipeRun is one run's settings.
type pipeRun struct {
	n, c, pool, tenants  int
	statements, constant bool
	log                  io.Writer
	rate                 float64 // items a second, open loop; 0: C clients in a closed loop
}

func runPipeline(ctx context.Context, base string, p pipeRun) (pipeResult, error) {
	n, c := p.n, p.c
	res := pipeResult{System: "assay", C: c, N: n, Rate: p.rate}
	var tenants []string
	for i := range p.tenants {
		tenants = append(tenants, fmt.Sprintf("t%d", i+1))
	}
	stmts := newStmtCounter()
	bed, err := startBenchBed(ctx, base, cell.Options{
		Log:        benchLogger(p.log, 0, fmt.Sprintf("pipeline c=%d", c)),
		Classifier: classifier.Config{Concurrency: 32, CallTimeout: 10 * time.Second},
		// Every post is to be served, as the River build serves it:
		// capacity admission would refuse what waits behind the backlog.
		Ingress:     ingress.Config{Shed: ingress.ShedConfig{Off: true}},
		StoreTracer: stmts.tracer,
		Config:      config.Config{DatabasePool: p.pool},
	}, tenants, sim.Options{Constant: p.constant})
	if err != nil {
		return res, err
	}
	defer bed.close()
	cl, db, dbName, tokens := bed.cell, bed.db, bed.dbName, bed.tokens
	before, err := pgFigures(ctx, db, dbName)
	if err != nil {
		return res, err
	}
	stmts.reset()
	cpu0 := cpuNow()
	start := time.Now()
	if err := postAll(ctx, cl.URL, n, c, p.rate, tenants, tokens); err != nil {
		return res, err
	}
	if err := waitSettled(ctx, db); err != nil {
		return res, err
	}
	res.Wall = time.Since(start)
	cpu := cpuNow().since(cpu0)
	by := stmts.snapshot()
	if p.statements {
		stmts.print(os.Stderr, n)
	}
	after, err := pgFigures(ctx, db, dbName)
	if err != nil {
		return res, err
	}
	p50, p99, err := acceptedLatency(ctx, db, n)
	if err != nil {
		return res, err
	}
	if err := describeEnd(ctx, db, c, start, res.Wall); err != nil {
		return res, err
	}
	msgs, err := streamMessages(ctx, cl)
	if err != nil {
		return res, err
	}
	wall := res.Wall.Seconds()
	res.ItemsPerSec = float64(n) / wall
	res.P50, res.P99 = p50, p99
	res.CommitsPerItem = float64(after.commits-before.commits) / float64(n)
	res.WALKBPerItem = float64(after.wal-before.wal) / 1024 / float64(n)
	res.MessagesPerItem = float64(msgs) / float64(n)
	res.StmtsBy = map[string]float64{}
	for svc, k := range by {
		res.StmtsBy[svc] = float64(k) / float64(n)
		res.StmtsPerItem += float64(k) / float64(n)
	}
	res.ProcCores, res.PGCores = cpu.proc.Seconds()/wall, cpu.pg.Seconds()/wall
	// The cell's database is the run's own, so its counters are the run's.
	_, _ = db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	if err := db.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'work'`).
		Scan(&res.WorkUpdates, &res.WorkHOT); err != nil {
		return res, err
	}
	return res, nil
}

// acceptedLatency is the p50 and p99 of the accepted items' time from
// created to accepted, and an error unless all n were accepted.
func acceptedLatency(ctx context.Context, db *pgxpool.Pool, n int) (p50, p99 time.Duration, err error) {
	var s50, s99 float64
	var accepted int
	if err := db.QueryRow(ctx, `SELECT count(*),
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)), 0),
			coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)), 0)
		FROM work WHERE state = 'accepted'`).Scan(&accepted, &s50, &s99); err != nil {
		return 0, 0, err
	}
	if accepted != n {
		return 0, 0, fmt.Errorf("%d of %d items accepted", accepted, n)
	}
	return time.Duration(s50 * float64(time.Second)), time.Duration(s99 * float64(time.Second)), nil
}

// streamMessages is how many messages the cell's streams hold.
func streamMessages(ctx context.Context, cl *cell.Cell) (uint64, error) {
	var msgs uint64
	names := event.Names{Installation: event.DefaultInstallation, Cell: "us"}
	for _, k := range event.Kinds {
		st, err := cl.Env.JS.Stream(ctx, names.Stream(k))
		if err != nil {
			return 0, err
		}
		msgs += st.CachedInfo().State.Msgs
	}
	return msgs, nil
}

// describeEnd prints where the wall went at the end of a run: one whose
// last acceptance or last ledger row comes long after the rest waited for
// something (a redelivery, a reaper) rather than for the pipeline; and the
// three slowest items, by stage.
func describeEnd(ctx context.Context, db *pgxpool.Pool, c int, start time.Time, wall time.Duration) error {
	var lastAccepted, lastLedgered, slowest float64
	var over10 int
	if err := db.QueryRow(ctx, `SELECT extract(epoch FROM max(updated_at) - $1::timestamptz),
			extract(epoch FROM max(updated_at - created_at)),
			count(*) FILTER (WHERE updated_at - created_at > interval '10 seconds' + (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY updated_at - created_at) FROM work WHERE state = 'accepted')),
			(SELECT extract(epoch FROM max(recorded_at) - $1::timestamptz) FROM ledger)
		FROM work WHERE state = 'accepted'`, start).Scan(&lastAccepted, &slowest, &over10, &lastLedgered); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "run c=%d: last item accepted at %.1fs, last ledger row at %.1fs, settled at %.1fs; slowest item %.1fs, %d items over p99 + 10s\n",
		c, lastAccepted, lastLedgered, wall.Seconds(), slowest, over10)
	rows, err := db.Query(ctx, `SELECT w.id, w.dispatch, w.attempts,
			extract(epoch FROM min(a.started_at) - w.created_at), extract(epoch FROM max(a.finished_at) - min(a.started_at)),
			extract(epoch FROM w.updated_at - max(a.finished_at)), string_agg(a.outcome, ',' ORDER BY a.number)
		FROM work w JOIN attempts a ON a.work_id = w.id
		WHERE w.state = 'accepted' GROUP BY w.id ORDER BY w.updated_at - w.created_at DESC LIMIT 3`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, outcomes string
		var dispatch, attempts int
		var toClaim, call, toCommit float64
		if err := rows.Scan(&id, &dispatch, &attempts, &toClaim, &call, &toCommit, &outcomes); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "  %s: dispatch %d, attempts %d (%s); created -> first claim %.1fs, claim -> last answer %.1fs, answer -> accepted %.1fs\n",
			id, dispatch, attempts, outcomes, toClaim, call, toCommit)
	}
	return rows.Err()
}

// postAll posts n distinct code reviews of the evaluation set's diffs, the
// tenants in turn; every post must be answered 202. With rate 0, c
// keep-alive clients post one after another (a closed loop); with a rate,
// the i-th post starts at i/rate seconds whatever the earlier ones are
// waiting for (an open loop), at most c of them in flight.
func postAll(ctx context.Context, base string, n, c int, rate float64, tenants []string, tokens map[string]string) error {
	items := evalset.Items()
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}}
	var retried atomic.Int64
	var mu sync.Mutex
	failed := map[string]int{} // what the posts that were not 202 got
	fail := func(why string) {
		mu.Lock()
		failed[why]++
		mu.Unlock()
	}
	post := func(i int) {
		req := celltest.CodeReview(items[i%len(items)], "pipeline")
		req.SourceID = fmt.Sprintf("shop/bench#%d", i)
		body, _ := json.Marshal(req)
		var resp *http.Response
		var raw []byte
		var err error
		// A 503 says the work was not stored and to try again: a
		// client does, up to three times, and the retries are told.
		for try := 0; try < 4; try++ {
			if try > 0 {
				retried.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
			hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/work", bytes.NewReader(body))
			hr.Header.Set("Authorization", "Bearer "+tokens[tenants[i%len(tenants)]])
			if resp, err = client.Do(hr); err != nil {
				break
			}
			raw, _ = io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				break
			}
		}
		if err != nil {
			fail(err.Error())
			return
		}
		if resp.StatusCode != http.StatusAccepted {
			var e struct {
				Error struct{ Code, Message string }
			}
			_ = json.Unmarshal(raw, &e)
			fail(fmt.Sprintf("HTTP %d %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message))
		}
	}
	late := dispatch(n, c, rate, post)
	if r := retried.Load(); r > 0 {
		fmt.Fprintf(os.Stderr, "bench pipeline: %d posts answered 503 unavailable and were sent again\n", r)
	}
	if l := late; l > 0 {
		fmt.Fprintf(os.Stderr, "bench pipeline: %d posts started late, all %d slots in flight: the open loop fell behind its rate\n", l, c)
	}
	if len(failed) > 0 {
		var b strings.Builder
		total := 0
		for why, k := range failed {
			total += k
			fmt.Fprintf(&b, "\n  %d× %s", k, why)
		}
		return fmt.Errorf("%d of %d posts were not accepted with 202:%s", total, n, b.String())
	}
	return nil
}

// waitSettled waits until every item has its outcome and every attempt its
// ledger row. It asks whether any work is open, through the index of open
// work's deadlines, which answers with its first entry however deep the
// backlog (a count of the open work cost a scan of the backlog ten times a
// second: a fifth of a core at 40,000 items), and about the ledger only
// once none is, so the wait adds little to the Postgres it measures.
func waitSettled(ctx context.Context, db *pgxpool.Pool) error {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var open, unledgered int
		err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM work WHERE state IN ('queued', 'running')
			ORDER BY deadline_at LIMIT 1) AS w`).Scan(&open)
		if err == nil && open == 0 {
			err = db.QueryRow(ctx, `SELECT count(*) FROM attempts a
				WHERE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.attempt_id = a.id)`).Scan(&unledgered)
			if err == nil && unledgered == 0 {
				return nil
			}
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			if open > 0 {
				return errors.New("after 10 minutes some items still have no outcome")
			}
			return fmt.Errorf("after 10 minutes %d attempts have no ledger row", unledgered)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pgCounters are the database's commit count and the server's WAL position.
type pgCounters struct{ commits, wal int64 }

func pgFigures(ctx context.Context, db *pgxpool.Pool, name string) (pgCounters, error) {
	var f pgCounters
	_, _ = db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	err := db.QueryRow(ctx, `SELECT xact_commit, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_stat_database WHERE datname = $1`,
		name).Scan(&f.commits, &f.wal)
	return f, err
}

// cpuSample is the CPU time used so far by this process and by every
// postgres process on the machine.
type cpuSample struct{ proc, pg time.Duration }

func cpuNow() cpuSample {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	s := cpuSample{proc: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	tick := 100.0 // USER_HZ on Linux
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil || !bytes.Contains(b, []byte("(postgres)")) {
			continue
		}
		rest := b[bytes.LastIndexByte(b, ')')+2:]
		f := strings.Fields(string(rest))
		if len(f) > 12 {
			u, _ := strconv.ParseFloat(f[11], 64)
			sy, _ := strconv.ParseFloat(f[12], 64)
			s.pg += time.Duration((u + sy) / tick * float64(time.Second))
		}
	}
	return s
}

func (s cpuSample) since(o cpuSample) cpuSample {
	return cpuSample{proc: s.proc - o.proc, pg: s.pg - o.pg}
}

// runPeer runs the River build once and reads its RESULT line.
func runPeer(ctx context.Context, dir string, n, c int) (pipeResult, error) {
	res := pipeResult{System: "river", C: c, N: n}
	cmd := exec.CommandContext(ctx, "go", "run", ".", "-n", strconv.Itoa(n), "-c", strconv.Itoa(c))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("%v\n%s", err, out.String())
	}
	var line string
	for sc := bufio.NewScanner(&out); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "RESULT ") {
			line = sc.Text()
		} else if strings.HasPrefix(sc.Text(), "per item: ") && strings.Contains(sc.Text(), "commits") {
			fmt.Sscanf(strings.TrimPrefix(sc.Text(), "per item: "), "%f", &res.CommitsPerItem)
		}
	}
	if line == "" {
		return res, fmt.Errorf("no RESULT line in its output:\n%s", out.String())
	}
	kv := map[string]float64{}
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		kv[k], _ = strconv.ParseFloat(v, 64)
	}
	res.Wall = time.Duration(kv["wall_s"] * float64(time.Second))
	res.ItemsPerSec = kv["items_per_s"]
	res.P50, res.P99 = time.Duration(kv["p50_ms"]*float64(time.Millisecond)), time.Duration(kv["p99_ms"]*float64(time.Millisecond))
	res.WALKBPerItem = kv["wal_kb_per_item"]
	res.ProcCores, res.PGCores = kv["proc_cores"], kv["pg_cores"]
	return res, nil
}

func printPipe(w io.Writer, rs []pipeResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SYSTEM\tC\tN\tWALL\tITEMS/S\tP50\tP99\tCOMMITS/ITEM\tSTMTS/ITEM\tWAL KB/ITEM\tJS MSGS/ITEM\tPROC CORES\tPG CORES")
	for _, r := range rs {
		msgs, stmts := "-", "-"
		if r.System == "assay" {
			msgs, stmts = fmt.Sprintf("%.2f", r.MessagesPerItem), fmt.Sprintf("%.2f", r.StmtsPerItem)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1fs\t%.0f\t%s\t%s\t%.2f\t%s\t%.2f\t%s\t%.2f\t%.2f\n", r.System, r.C, r.N, r.Wall.Seconds(),
			r.ItemsPerSec, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.CommitsPerItem, stmts, r.WALKBPerItem, msgs,
			r.ProcCores, r.PGCores)
	}
	_ = tw.Flush()
	for _, r := range rs {
		if r.Rate > 0 {
			fmt.Fprintf(w, "c=%d: posted open loop at %.0f items/s\n", r.C, r.Rate)
		}
	}
	for _, r := range rs {
		if r.System != "assay" {
			continue
		}
		var parts []string
		for _, svc := range []string{"ingress", "classifier", "committer", "ledger"} {
			parts = append(parts, fmt.Sprintf("%s %.2f", svc, r.StmtsBy[svc]))
		}
		fmt.Fprintf(w, "statements per item, c=%d: %s; work-row updates %d, heap-only %d (%.0f %%)\n", r.C, strings.Join(parts, ", "),
			r.WorkUpdates, r.WorkHOT, 100*float64(r.WorkHOT)/float64(max(r.WorkUpdates, 1)))
	}
	// The ratio per client count, over the runs of each.
	sum := map[string]map[int][2]float64{}
	for _, r := range rs {
		if sum[r.System] == nil {
			sum[r.System] = map[int][2]float64{}
		}
		v := sum[r.System][r.C]
		sum[r.System][r.C] = [2]float64{v[0] + r.ItemsPerSec, v[1] + 1}
	}
	if sum["river"] == nil {
		return
	}
	for c, a := range sum["assay"] {
		if p, ok := sum["river"][c]; ok && p[0] > 0 {
			fmt.Fprintf(w, "c=%d: assay %.0f items/s, river %.0f items/s: %.2fx\n", c, a[0]/a[1], p[0]/p[1], (a[0]/a[1])/(p[0]/p[1]))
		}
	}
}

// stmtCounter counts the statements each service's pool sends, BEGIN and
// COMMIT included, each query of a batch on its own.
type stmtCounter struct {
	mu  sync.Mutex
	n   map[string]int64            // per service
	sql map[string]map[string]int64 // per service, per statement
}

func newStmtCounter() *stmtCounter {
	return &stmtCounter{n: map[string]int64{}, sql: map[string]map[string]int64{}}
}

func (s *stmtCounter) tracer(service string) pgx.QueryTracer { return stmtTracer{s, service} }

func (s *stmtCounter) count(service, sql string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[service]++
	if s.sql[service] == nil {
		s.sql[service] = map[string]int64{}
	}
	s.sql[service][sql]++
}

func (s *stmtCounter) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.n)
	clear(s.sql)
}

// snapshot is the counts so far, per service.
func (s *stmtCounter) snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for k, v := range s.n {
		out[k] = v
	}
	return out
}

// print writes each service's statements per item, most frequent first.
func (s *stmtCounter) print(w io.Writer, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, svc := range []string{"ingress", "classifier", "committer", "ledger"} {
		fmt.Fprintf(w, "%s: %.2f statements per item\n", svc, float64(s.n[svc])/float64(n))
		by := map[string]int64{}
		for sql, k := range s.sql[svc] {
			by[stmtLabel(sql)] += k
		}
		labels := make([]string, 0, len(by))
		for l := range by {
			labels = append(labels, l)
		}
		sort.Slice(labels, func(i, j int) bool { return by[labels[i]] > by[labels[j]] })
		for _, l := range labels {
			fmt.Fprintf(w, "  %6.3f  %s\n", float64(by[l])/float64(n), l)
		}
	}
}

// stmtLabel is a statement's first words, enough to tell it from the rest.
func stmtLabel(sql string) string {
	f := strings.Fields(sql)
	if len(f) > 6 {
		f = f[:6]
	}
	return strings.Join(f, " ")
}

type stmtTracer struct {
	c       *stmtCounter
	service string
}

func (t stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.c.count(t.service, d.SQL)
	return ctx
}

func (stmtTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t stmtTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t stmtTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.c.count(t.service, d.SQL)
}

func (stmtTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
