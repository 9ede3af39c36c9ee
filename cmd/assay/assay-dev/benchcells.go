package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

const benchCellsUsage = `usage: assay-dev bench cells [--cells 10] [--tenants 1000] [-n 3000] [--rate 60] [-c 64] [--pool 1]

A region of --cells cells in this process, on one NATS and one Postgres
server, each cell its own database: --tenants tenants placed by the
placement map's default rule (the least loaded cell), -n code reviews posted
open loop at --rate a second (at most -c at once) for tenants in turn, each
to one of the region's cells in turn (most reach a cell that sends them on),
and halfway through one tenant moved to another cell. It prints per cell the
tenants it serves, its work, and its database's transactions and rows
written a second, idle (a window before the load) and under the load, then
the move: how long the tenant's requests were held
and what was copied. Postgres: ASSAY_DATABASE_URL, else a throwaway server
from the PostgreSQL binaries on the machine.
`

// idleWindow is how long each cell's database is watched with no work, and
// statsLag how long its counters may lag: a backend reports them at most
// every second, an idle one after ten (Postgres's PGSTAT_IDLE_INTERVAL).
// Variables, so a test of the command's workings can shorten them.
var (
	idleWindow = 10 * time.Second
	statsLag   = 11 * time.Second
)

// benchCell is one cell of the simulated region.
type benchCell struct {
	id     string
	cell   *cell.Cell
	db     *pgxpool.Pool
	dbName string
	before pgDBCounters
	idle   pgDBCounters // over the idle window before the load
}

// pgDBCounters are a database's transaction and row counters.
type pgDBCounters struct{ commits, rows int64 }

func dbCounters(ctx context.Context, db *pgxpool.Pool, name string) (pgDBCounters, error) {
	var c pgDBCounters
	_, _ = db.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
	err := db.QueryRow(ctx, `SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = $1`,
		name).Scan(&c.commits, &c.rows)
	return c, err
}

// cellsRun is one assay-dev bench cells run, as its flags ask.
type cellsRun struct {
	cells, tenants, n, c, pool int
	rate                       float64
}

func parseCellsRun(args []string) (cellsRun, error) {
	var r cellsRun
	fs := flag.NewFlagSet("assay-dev bench cells", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&r.cells, "cells", 10, "cells in the region")
	fs.IntVar(&r.tenants, "tenants", 1000, "tenants, placed on the cells")
	fs.IntVar(&r.n, "n", 3000, "code reviews to post")
	fs.Float64Var(&r.rate, "rate", 60, "posts a second, open loop")
	fs.IntVar(&r.c, "c", 64, "posts in flight at most")
	fs.IntVar(&r.pool, "pool", 1, "connections in each service's pool")
	if err := fs.Parse(args); err != nil {
		return r, cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, benchCellsUsage)}
	}
	switch {
	case r.cells < 2 || r.cells > 20:
		return r, cli.ConfigError{Err: fmt.Errorf("--cells: %d is not from 2 to 20", r.cells)}
	case r.tenants < r.cells || r.tenants > 100_000:
		return r, cli.ConfigError{Err: fmt.Errorf("--tenants: %d is not from --cells to 100000", r.tenants)}
	case r.n < 10 || r.rate <= 0 || r.c < 1 || r.pool < 1:
		return r, cli.ConfigError{Err: errors.New("-n (at least 10), --rate, -c and --pool must be positive")}
	}
	return r, nil
}

// benchServers starts what a bench of cells in this process stands on: a
// Postgres (benchPostgres) and an embedded NATS keeping its streams in a
// directory of its own; stop ends both and removes the directory.
func benchServers(ctx context.Context, name string) (base string, ns *server.Server, stop func(), err error) {
	base, stopPG, err := benchPostgres(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	dir, err := os.MkdirTemp("", "assay-bench-"+name+"-")
	if err != nil {
		stopPG()
		return "", nil, nil, err
	}
	if ns, err = cell.StartNATS(dir); err != nil {
		os.RemoveAll(dir)
		stopPG()
		return "", nil, nil, err
	}
	return base, ns, func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
		stopPG()
	}, nil
}

func benchCells(ctx context.Context, args []string, stdout io.Writer) error {
	run, err := parseCellsRun(args)
	if err != nil {
		return err
	}
	base, ns, stop, err := benchServers(ctx, "cells")
	if err != nil {
		return err
	}
	defer stop()
	model := sim.New(sim.Options{Constant: true})
	defer model.Close()
	simURL, err := model.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	cells, err := startRegion(ctx, base, ns.ClientURL(), simURL, run.cells, run.pool)
	defer func() {
		for _, bc := range cells {
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
	kv, tokens, err := placeTenants(ctx, cells, run.tenants)
	if err != nil {
		return err
	}
	if err := measureIdle(ctx, cells); err != nil {
		return err
	}
	l, err := loadAndMove(ctx, cells, kv, tokens, run)
	if err != nil {
		return err
	}
	time.Sleep(statsLag) // the counters catch up with the load; the idle rate is taken off
	snap, err := placement.Read(ctx, kv, "us")
	if err != nil {
		return err
	}
	return printRegion(ctx, stdout, cells, snap, run.n, l)
}

// measureIdle reads what each cell does with no work at all (its relays,
// sweepers and reporters) over an idle window, once the counters have
// caught up with the seeding, and starts each cell's count of the load.
func measureIdle(ctx context.Context, cells []*benchCell) error {
	time.Sleep(statsLag)
	var err error
	for _, bc := range cells {
		if bc.idle, err = dbCounters(ctx, bc.db, bc.dbName); err != nil {
			return err
		}
	}
	time.Sleep(idleWindow)
	for _, bc := range cells {
		if bc.before, err = dbCounters(ctx, bc.db, bc.dbName); err != nil {
			return err
		}
		bc.idle = pgDBCounters{commits: bc.before.commits - bc.idle.commits, rows: bc.before.rows - bc.idle.rows}
	}
	return nil
}

// load is what loadAndMove did.
type load struct {
	wall            time.Duration
	late            int64
	mover, from, to string
	moved           placement.MoveReport
}

// loadAndMove posts run.n reviews for the tenants in turn, each to the region's cells in turn, and halfway moves the
// first tenant to the cell after its own; it returns once every cell's work has ended.
func loadAndMove(ctx context.Context, cells []*benchCell, kv jetstream.KeyValue, tokens map[string]string, run cellsRun) (load, error) {
	snap, err := placement.Read(ctx, kv, "us")
	if err != nil {
		return load{}, err
	}
	l := load{mover: cellsTenant(0)}
	l.from = snap.CellOf(l.mover)
	fromAt := slices.IndexFunc(cells, func(bc *benchCell) bool { return bc.id == l.from })
	to := cells[(fromAt+1)%len(cells)]
	l.to = to.id
	var moveErr error
	var moveWG sync.WaitGroup
	var refused atomic.Int64
	client := &http.Client{Timeout: 60 * time.Second}
	start := time.Now()
	l.late = dispatch(run.n, run.c, run.rate, func(i int) {
		if i == run.n/2 {
			moveWG.Go(func() {
				l.moved, moveErr = placement.Move(ctx, kv, "us", cells[fromAt].cell.Env.Store, to.cell.Env.Store, l.mover, l.from, l.to,
					placement.MoveOptions{Settle: time.Minute})
			})
		}
		t := cellsTenant(i % run.tenants)
		if !postRetrying(ctx, client, cells[i%len(cells)].cell.URL, tokens[t], i) {
			refused.Add(1)
		}
	})
	moveWG.Wait()
	if moveErr != nil {
		return l, fmt.Errorf("the move of %s: %w", l.mover, moveErr)
	}
	for _, bc := range cells {
		if err := waitSettled(ctx, bc.db); err != nil {
			return l, err
		}
	}
	l.wall = time.Since(start)
	if refused.Load() > 0 {
		return l, fmt.Errorf("%d of %d posts were refused", refused.Load(), run.n)
	}
	return l, nil
}

// startRegion starts ncells cells of region us on one NATS, each its own
// database, each registered where it listens; each adjust, when given, may
// change the i-th cell's options before it starts.
func startRegion(ctx context.Context, base, natsURL, simURL string, ncells, pool int, adjust ...func(i int, o *cell.Options)) ([]*benchCell, error) {
	var cells []*benchCell
	stamp := time.Now().UnixNano()
	for i := range ncells {
		id := "us"
		if i > 0 {
			id = fmt.Sprintf("us-%d", i+1)
		}
		bc := &benchCell{id: id, dbName: fmt.Sprintf("assay_region_%d_%d", stamp, i)}
		dbURL, err := cell.CreateDatabase(ctx, base, bc.dbName)
		if err != nil {
			return cells, err
		}
		cfg := config.Config{Regions: config.DefaultRegions, Region: "us", Cell: id, Installation: event.DefaultInstallation,
			DatabaseURL: dbURL, NATSURL: natsURL, ModelBaseURL: sim.APIBase(simURL), Model: "assay-sim-1", HTTPAddr: "127.0.0.1:0",
			DatabasePool: pool}
		o := cell.Options{Config: cfg, Log: benchLogger(io.Discard, 0, "cell "+id), RegisterURL: true,
			Ingress: ingress.Config{Shed: ingress.ShedConfig{Off: true}}}
		for _, f := range adjust {
			f(i, &o)
		}
		if bc.cell, err = cell.Start(ctx, o); err != nil {
			return cells, fmt.Errorf("cell %s: %w", id, err)
		}
		pc, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return cells, err
		}
		pc.MaxConns = 1
		if bc.db, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return cells, err
		}
		cells = append(cells, bc)
	}
	return cells, nil
}

// cellsTenant names the i-th tenant of the region, from 0: t1, t2, …
func cellsTenant(i int) string { return fmt.Sprintf("t%d", i+1) }

// placeTenants adds the tenants to every cell, with one token each that
// every cell knows, and places each by the map's default rule.
func placeTenants(ctx context.Context, cells []*benchCell, ntenants int) (jetstream.KeyValue, map[string]string, error) {
	tokens := map[string]string{}
	var seeds []store.TenantSeed
	var tenants []string
	for i := range ntenants {
		t := cellsTenant(i)
		tenants = append(tenants, t)
		tokens[t] = store.NewToken()
		seeds = append(seeds, store.TenantSeed{ID: t, HomeRegion: "us", Token: tokens[t]})
	}
	for _, bc := range cells {
		if err := bc.cell.Env.Store.SeedTenants(ctx, seeds); err != nil {
			return nil, nil, err
		}
		// A steady load, not tenants over their rates.
		for _, t := range tenants {
			if err := bc.cell.Env.Store.SetRate(ctx, t, 6000, 600); err != nil {
				return nil, nil, err
			}
		}
	}
	kv, err := placement.Bucket(ctx, cells[0].cell.Env.JS, cells[0].cell.Env.Config.Names().PlacementBucket("us"), 1)
	if err != nil {
		return nil, nil, err
	}
	snap, err := placement.Read(ctx, kv, "us")
	if err != nil {
		return nil, nil, err
	}
	for _, t := range tenants {
		c := snap.Choose()
		if err := placement.Place(ctx, kv, t, c); err != nil {
			return nil, nil, err
		}
		snap.Tenants[t] = c
	}
	// Every cell's ingress has heard the last placement once a request for
	// that tenant is answered by its cell from each.
	last := tenants[len(tenants)-1]
	for _, bc := range cells {
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, bc.cell.URL+"/v1/views", nil)
			req.Header.Set("Authorization", "Bearer "+tokens[last])
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				by := resp.Header.Get(ingress.ServedBy)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && (by == snap.Tenants[last] || (by == "" && bc.id == snap.Tenants[last])) {
					break
				}
			}
			if time.Now().After(end) {
				return nil, nil, fmt.Errorf("cell %s has not heard the placements within 30s", bc.id)
			}
		}
	}
	return kv, tokens, nil
}

// postRetrying posts code review i as the token's tenant to url until it
// is taken, holding back while the tenant moves (503, try again).
func postRetrying(ctx context.Context, client *http.Client, url, token string, i int) bool {
	it := evalset.Items()[i%len(evalset.Items())]
	in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": fmt.Sprintf("region %d", i)})
	body, _ := json.Marshal(ingress.SubmitRequest{Contract: "code-review", SourceID: fmt.Sprintf("shop/region#%d", i+1),
		Revision: it.Revision, Input: in})
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/work", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted, http.StatusOK:
			return true
		case http.StatusServiceUnavailable, http.StatusTooManyRequests:
			continue
		default:
			return false
		}
	}
	return false
}

// printRegion prints each cell's share of the region's work and its
// database's write rate, then the move.
func printRegion(ctx context.Context, w io.Writer, cells []*benchCell, snap *placement.Snapshot, n int, l load) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "region us: %d cells, %d tenants, %d reviews in %.1f s (%.1f a second; %d posts late)\n",
		len(cells), len(snap.Tenants), n, l.wall.Seconds(), float64(n)/l.wall.Seconds(), l.late)
	fmt.Fprintln(tw, "cell\ttenants\twork\taccepted\txacts/s idle\txacts/s\trows written/s idle\trows written/s\txacts/item over idle\t")
	load := map[string]int{}
	for _, c := range snap.Tenants {
		load[c]++
	}
	var total int
	for _, bc := range cells {
		after, err := dbCounters(ctx, bc.db, bc.dbName)
		if err != nil {
			return err
		}
		var work, accepted int
		if err := bc.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'accepted') FROM work`).Scan(&work, &accepted); err != nil {
			return err
		}
		total += work
		commits, rows := after.commits-bc.before.commits, after.rows-bc.before.rows
		idleRate := float64(bc.idle.commits) / idleWindow.Seconds()
		span := l.wall + statsLag
		perItem := 0.0
		if work > 0 {
			perItem = (float64(commits) - idleRate*span.Seconds()) / float64(work)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", bc.id, load[bc.id], work, accepted, idleRate,
			float64(commits)/span.Seconds(), float64(bc.idle.rows)/idleWindow.Seconds(), float64(rows)/span.Seconds(), perItem)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "work in all cells: %d of %d posted\n", total, n)
	fmt.Fprintf(w, "moved %s from %s to %s under the load: its requests held %s; copied %s\n", l.mover, l.from, l.to,
		l.moved.Held.Round(time.Millisecond), cli.RowCounts(l.moved.Copied))
	return nil
}
