// Command chaos proves assay's promise under faults: at-least-once execution
// with exactly-once effects. It runs nats-server and the four services of
// both cells as separate processes against a real Postgres, with the
// simulated provider in its own process, drives work through the ingress
// API (some keys delivered many times at once), injects faults on a seeded
// schedule (SIGKILLs at chosen moments, broker and database restarts, lost
// broker messages, a stalled model, broken answers), waits for the cells
// to settle and checks the invariants. It exits 1 when one is violated and
// prints the seed that repeats the run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"assay.dev/pkg/devkit/sim"
)

// Options size and shape one run. Zero values take the defaults given.
type Options struct {
	// Items is how many distinct keys are submitted. Default 5000.
	Items int
	// Tenants is how many tenants share them, homed in turn in us and eu.
	// Default 6.
	Tenants int
	// DupKeys of the keys are each delivered DupTimes at once. Defaults
	// 50 and 10.
	DupKeys, DupTimes int
	// Load is how long the submissions are spread over; the faults fall
	// within it. Default 7m.
	Load time.Duration
	// Faults are the kinds scheduled, each once. Default DefaultFaults, or
	// ClusterFaults in the cluster mode.
	Faults []string
	// Cluster runs each cell as production does: a three-node JetStream
	// cluster with R3 streams placed by the cell's tag, Postgres as a
	// primary and a synchronous standby, two processes of every service,
	// every connection through a link the faults can cut, slow or make
	// lossy (cluster.go, link.go). It starts its own Postgres servers.
	Cluster bool
	// Rounds is how many times each fault kind is scheduled. Default 1.
	Rounds int
	// FaultFor is how long a partition or a degraded link lasts, give or
	// take a quarter. Default 20s.
	FaultFor time.Duration
	// Seed orders and places the faults and shapes the load. Default: the
	// clock.
	Seed int64
	// Quiesce bounds the wait for the cells to settle after the load.
	// Default 8m.
	Quiesce time.Duration
	// Settle is how long everything must stay still to count as settled.
	// Default 12s (more than the ledger reaper's period).
	Settle time.Duration
	// GiveUp is how long a client keeps re-sending one request. Default 5m.
	GiveUp time.Duration
	// Concurrency is how many keys are submitted at once. Default 16.
	Concurrency int
	// SimLatency is added to every answer of the simulated provider.
	// Default 25ms.
	SimLatency time.Duration
	// DatabaseURL is a Postgres server to create the two cells' databases
	// on; empty starts a throwaway cluster, which pg-restart needs.
	DatabaseURL string
	// Src is the cmd/chaos module directory the binaries are built from.
	// Default ".".
	Src string
	// BinDir, when set, holds prebuilt ingress, classifier, committer,
	// ledger and nats-server binaries.
	BinDir string
	// Keep leaves the run's directory (logs, NATS store) behind.
	Keep bool
	// FastTimings runs the services with short leases, ack waits, sweeper
	// and reaper periods (the ASSAY_* timing variables), so that a small
	// run settles in seconds; the default is the services' own defaults.
	FastTimings bool
	// PGAsyncCommit leaves the throwaway cluster's synchronous_commit off,
	// to show what a Postgres crash then loses.
	PGAsyncCommit bool
	// IngressReplicas is how many ingress processes each cell runs, the
	// load sent to each in turn. Default 1.
	IngressReplicas int
	// Watch, when set, is called once every service is up, with where
	// they are; the check it returns runs after the report, while they
	// are still up. An error from either fails the run.
	Watch func(ctx context.Context, r Running) (check func(ctx context.Context) error, err error)
}

// Running is where a run's services are.
type Running struct {
	// Targets are the service processes, each with its region and the base
	// URL of its metrics listener (/metrics).
	Targets []Target
	// Databases are the cells' Postgres URLs by region.
	Databases map[string]string
	// Ingress are each cell's ingress base URLs (the API), one per replica.
	Ingress map[string][]string
	// Tokens are an API token of a tenant homed in each region.
	Tokens map[string]string
	// NATSURL is the run's NATS server.
	NATSURL string
	// Sim is the simulated provider, for a check that needs a fault of its
	// own.
	Sim interface{ AddFault(sim.Fault) error }
}

// Target is one running service.
type Target struct{ Service, Region, URL string }

func (o *Options) defaults() error {
	if o.Items == 0 {
		o.Items = 5000
	}
	if o.Tenants == 0 {
		o.Tenants = 6
	}
	if o.DupKeys == 0 {
		o.DupKeys = 50
	}
	if o.DupTimes == 0 {
		o.DupTimes = 10
	}
	if o.Load == 0 {
		o.Load = 7 * time.Minute
	}
	known := DefaultFaults
	if o.Cluster {
		known = append(append([]string(nil), ClusterFaults...), clusterAlso...)
	}
	if o.Faults == nil {
		o.Faults = DefaultFaults
		if o.Cluster {
			o.Faults = ClusterFaults
		}
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	if o.FaultFor == 0 {
		o.FaultFor = 20 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano() % 1_000_000
	}
	if o.Quiesce == 0 {
		o.Quiesce = 8 * time.Minute
	}
	if o.Settle == 0 {
		o.Settle = 12 * time.Second
	}
	if o.GiveUp == 0 {
		o.GiveUp = 5 * time.Minute
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if o.SimLatency == 0 {
		o.SimLatency = 25 * time.Millisecond
	}
	if o.Src == "" {
		o.Src = "."
	}
	var errs []error
	if o.Items < 1 || o.Tenants < 1 || o.DupKeys < 0 || o.DupKeys > o.Items || o.DupTimes < 1 {
		errs = append(errs, errors.New("-n, -tenants, -dup-keys and -dup-times must be positive, -dup-keys at most -n"))
	}
	for _, f := range o.Faults {
		if !slices.Contains(known, f) {
			errs = append(errs, fmt.Errorf("-faults: unknown fault %q (known: %s)", f, strings.Join(known, ", ")))
		}
	}
	if o.Cluster && o.DatabaseURL != "" {
		errs = append(errs, errors.New("-database-url: the cluster mode starts its own Postgres primary and standby per cell"))
	}
	if o.Rounds < 1 {
		errs = append(errs, errors.New("-rounds: at least 1"))
	}
	if o.FaultFor < time.Second {
		errs = append(errs, errors.New("-fault-for: at least 1s"))
	}
	return errors.Join(errs...)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout))
}

// run parses the flags and runs the harness: 0 when every invariant holds,
// 1 when one is violated or the run failed, 2 for bad flags.
func run(ctx context.Context, args []string, out io.Writer) int {
	var o Options
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.IntVar(&o.Items, "n", 5000, "work items (distinct ingress keys) to submit")
	fs.IntVar(&o.Tenants, "tenants", 6, "tenants, homed in turn in us and eu")
	fs.IntVar(&o.DupKeys, "dup-keys", 50, "keys delivered -dup-times at once")
	fs.IntVar(&o.DupTimes, "dup-times", 10, "concurrent identical deliveries of a duplicated key")
	fs.DurationVar(&o.Load, "load", 7*time.Minute, "spread the submissions over this long; faults fall within it")
	faults := fs.String("faults", "all", "comma-separated faults to schedule, each once; \"all\" or \"none\"; known: "+strings.Join(DefaultFaults, ", ")+
		"; with -cluster: "+strings.Join(append(append([]string(nil), ClusterFaults...), clusterAlso...), ", "))
	fs.Int64Var(&o.Seed, "seed", 0, "seed for the schedule and the load (default: from the clock; printed)")
	fs.DurationVar(&o.Quiesce, "quiesce", 8*time.Minute, "longest wait for the cells to settle after the load")
	fs.DurationVar(&o.Settle, "settle", 12*time.Second, "how long everything must stay still to count as settled")
	fs.DurationVar(&o.SimLatency, "sim-latency", 25*time.Millisecond, "latency of every simulated answer")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "keys submitted at once")
	fs.StringVar(&o.DatabaseURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "Postgres to create the cells' databases on ($ASSAY_DATABASE_URL; empty: a throwaway cluster, needed for pg-restart)")
	fs.StringVar(&o.Src, "src", ".", "the cmd/chaos module directory to build the binaries from")
	fs.StringVar(&o.BinDir, "bin-dir", "", "use prebuilt ingress, classifier, committer, ledger and nats-server from this directory")
	fs.BoolVar(&o.Keep, "keep", false, "keep the run's directory (service logs, NATS store)")
	fs.BoolVar(&o.FastTimings, "fast-timings", false, "run the services with short leases, ack waits and sweeper and reaper periods")
	fs.BoolVar(&o.Cluster, "cluster", false, "run each cell as a 3-node JetStream cluster (R3), a Postgres primary with a synchronous standby and two processes of every service, with the cluster's faults (make chaos-cluster)")
	fs.IntVar(&o.Rounds, "rounds", 1, "schedule each fault this many times")
	fs.DurationVar(&o.FaultFor, "fault-for", 20*time.Second, "how long a partition or a degraded link lasts (give or take a quarter)")
	fs.BoolVar(&o.PGAsyncCommit, "pg-async-commit", false, "leave the throwaway cluster's synchronous_commit off (a Postgres crash then loses acknowledged commits)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.Cluster {
		// The cluster mode starts its own servers; only an explicit
		// -database-url is a mistake.
		o.DatabaseURL = ""
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "database-url" {
				o.DatabaseURL = f.Value.String()
			}
		})
	}
	switch *faults {
	case "all":
	case "none", "":
		o.Faults = []string{}
	default:
		o.Faults = strings.Split(*faults, ",")
	}
	if err := o.defaults(); err != nil {
		fmt.Fprintln(out, "chaos:", err)
		return 2
	}
	ok, err := Run(ctx, o, out)
	if err != nil {
		fmt.Fprintf(out, "chaos: %v (seed %d)\n", err, o.Seed)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// Run runs one chaos experiment and reports whether every invariant held.
// An error means the run itself could not be carried out.
func Run(ctx context.Context, o Options, out io.Writer) (ok bool, err error) {
	if err := o.defaults(); err != nil {
		return false, err
	}
	h := newHarness(o, out)
	defer func() {
		keep := o.Keep || !ok
		h.tearDown(keep)
		if keep && h.dir != "" {
			fmt.Fprintf(out, "chaos: logs and NATS store kept in %s\n", h.dir)
		}
	}()
	h.logf("seed %d: %d keys over %s, faults: %s", o.Seed, o.Items, o.Load, strings.Join(o.Faults, ", "))
	if err := h.setUp(ctx); err != nil {
		return false, err
	}
	var check func(context.Context) error
	if o.Watch != nil {
		if check, err = o.Watch(ctx, h.running()); err != nil {
			return false, fmt.Errorf("watch: %w", err)
		}
	}
	subs := h.plan()
	sched := h.schedule()
	st := &loadStats{}
	t0 := time.Now()
	faultsDone := make(chan struct{})
	fctx, cancelFaults := context.WithCancel(ctx)
	defer cancelFaults()
	go func() { defer close(faultsDone); h.inject(fctx, t0, sched) }()
	stopWatch := h.startStrandWatch(ctx)
	defer stopWatch()
	h.drive(ctx, subs, st)
	h.loadEnd = time.Now()
	h.logf("load done: %d keys in %s", len(subs), h.loadEnd.Sub(t0).Round(time.Second))
	<-faultsDone
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	var ackedIDs []string
	for _, s := range subs {
		for id := range s.WorkIDs {
			ackedIDs = append(ackedIDs, id)
		}
	}
	quiet, qerr := h.quiesce(ctx, ackedIDs)
	if qerr != nil {
		h.note("%v", qerr)
	}
	stopWatch()
	checks, recs, err := h.evaluate(ctx, subs, sched)
	if err != nil {
		return false, err
	}
	checks = append(checks, retryAfterCheck(st))
	ok = h.report(out, checks, recs, subs, st, quiet)
	if check != nil {
		if err := check(ctx); err != nil {
			return false, fmt.Errorf("watch: %w", err)
		}
	}
	return ok, nil
}
