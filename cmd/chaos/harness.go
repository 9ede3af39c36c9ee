package main

import (
	"context"
	crand "crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/store"
)

// services are the four binaries, started once per region.
var services = []string{"ingress", "classifier", "committer", "ledger"}

// fastTimings are the services' timing settings for a run that must settle
// quickly: a dead worker's lease lapses in 3s, its work is swept 1s later,
// the reaper looks every second.
var fastTimings = []string{
	"ASSAY_LEASE_TTL=3s", "ASSAY_ACK_WAIT=5s", "ASSAY_HANDOFF_TTL=20s",
	"ASSAY_SWEEP_EVERY=500ms", "ASSAY_SWEEP_QUEUED_FOR=10s", "ASSAY_SWEEP_LEASE_GRACE=1s",
	"ASSAY_LEDGER_REAP_EVERY=1s", "ASSAY_LEDGER_REAP_GRACE=5s", "ASSAY_WATCH_EVERY=1s",
	"ASSAY_COMMITTER_REAP_EVERY=1s", "ASSAY_COMMITTER_REAP_GRACE=5s",
}

// ackWait is the classifier's consumer AckWait in this run.
func (h *Harness) ackWait() time.Duration {
	if h.o.FastTimings {
		return 5 * time.Second
	}
	return 30 * time.Second
}

// tenant is one seeded tenant.
type tenant struct {
	ID, Region, Token string
}

// Harness is one chaos run: the processes it started and what it observed.
type Harness struct {
	o   Options
	rng *rand.Rand
	out io.Writer
	dir string

	bins map[string]string

	nats      *proc
	natsURL   string
	natsStore string

	pg      *pgControl // nil when the server is not ours to restart
	baseURL string
	dbName  map[string]string
	dbURL   map[string]string
	pool    map[string]*pgxpool.Pool

	sim   *sim.Server
	front *simFront
	// gh is the GitHub API the committers publish to, as app 1 with the
	// key in ghKey; every tenant's installation covers chaos/*.
	gh     *fakegithub.Server
	ghKey  string
	simURL string
	simSrv *http.Server

	procs   map[string]*proc // "classifier-us", "ingress-us-2", or "classifier-us-1" in the cluster mode
	cl      *clusterRun      // the cluster mode's cells and links; nil otherwise
	strands *strandWatch
	// metricsURL is each process's metrics listener (ASSAY_METRICS_ADDR).
	metricsURL  map[string]string
	ingressTurn atomic.Uint64
	loadEnd     time.Time
	tenants     []tenant
	started     time.Time

	outMu sync.Mutex // out may be a bytes.Buffer, written from the load, the faults and the checks
	mu    sync.Mutex
	notes []string
}

func newHarness(o Options, out io.Writer) *Harness {
	return &Harness{o: o, out: out, started: time.Now(), rng: rand.New(rand.NewPCG(uint64(o.Seed), 0x61737361)),
		bins: map[string]string{}, dbName: map[string]string{}, dbURL: map[string]string{},
		pool: map[string]*pgxpool.Pool{}, procs: map[string]*proc{}, metricsURL: map[string]string{},
		strands: newStrandWatch()}
}

func (h *Harness) logf(format string, args ...any) {
	line := fmt.Sprintf("chaos %6.1fs  %s\n", time.Since(h.started).Seconds(), fmt.Sprintf(format, args...))
	h.outMu.Lock()
	defer h.outMu.Unlock()
	_, _ = io.WriteString(h.out, line)
}

func (h *Harness) note(format string, args ...any) {
	h.mu.Lock()
	h.notes = append(h.notes, fmt.Sprintf(format, args...))
	h.mu.Unlock()
}

// setUp builds the binaries and starts Postgres, nats-server, the simulated
// provider and every service of both cells.
func (h *Harness) setUp(ctx context.Context) (err error) {
	h.started = time.Now()
	reapRunDirs()
	if h.dir, err = os.MkdirTemp("", "assay-chaos-"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if err := h.build(ctx); err != nil {
		return err
	}
	if h.o.Cluster {
		if err := h.setUpCluster(ctx); err != nil {
			return err
		}
		if err := h.clusterPools(ctx); err != nil {
			return err
		}
	} else {
		if err := h.startPostgres(ctx); err != nil {
			return err
		}
		if err := h.startNATS(ctx); err != nil {
			return err
		}
	}
	if err := h.startSim(); err != nil {
		return err
	}
	if err := h.startGitHub(); err != nil {
		return err
	}
	if err := h.seed(ctx); err != nil {
		return err
	}
	return h.startServices(ctx)
}

// build compiles the four services and nats-server into the run's dir, or
// uses the ones in Options.BinDir.
func (h *Harness) build(ctx context.Context) error {
	names := append([]string{"nats-server"}, services...)
	if h.o.BinDir != "" {
		for _, n := range names {
			p := filepath.Join(h.o.BinDir, n)
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("-bin-dir: %w", err)
			}
			h.bins[n] = p
		}
		return nil
	}
	bin := filepath.Join(h.dir, "bin")
	h.logf("building nats-server and the four services into %s", bin)
	args := []string{"build", "-o", bin + "/"}
	for _, s := range services {
		args = append(args, "assay.dev/services/"+s+"/cmd/"+s)
	}
	args = append(args, "github.com/nats-io/nats-server/v2")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = h.o.Src
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	for _, n := range names {
		h.bins[n] = filepath.Join(bin, n)
	}
	return nil
}

// pgControl restarts a Postgres cluster the harness started, with pg_ctl run
// as the owner of its data directory.
type pgControl struct {
	cluster  *devpg.Cluster
	data     string
	binDir   string
	uid, gid uint32
}

func (h *Harness) startPostgres(ctx context.Context) error {
	if h.o.DatabaseURL != "" {
		h.baseURL = h.o.DatabaseURL
	} else {
		c, err := devpg.Start(ctx, "")
		if err != nil {
			return fmt.Errorf("throwaway postgres (or set ASSAY_DATABASE_URL): %w", err)
		}
		h.pg = &pgControl{cluster: c}
		h.baseURL = c.URL("postgres")
	}
	conn, err := pgx.Connect(ctx, h.baseURL)
	if err != nil {
		return fmt.Errorf("postgres %s: %w", redact(h.baseURL), err)
	}
	defer conn.Close(context.Background())
	if h.pg != nil {
		if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&h.pg.data); err != nil {
			return err
		}
		if err := conn.QueryRow(ctx, `SELECT setting FROM pg_config WHERE name = 'BINDIR'`).Scan(&h.pg.binDir); err != nil {
			return err
		}
		// devpg turns synchronous_commit off for speed; then a crash of
		// Postgres loses commits it had acknowledged (a claim, a work row),
		// which no service can make up for. Production keeps it on, and
		// so does the harness unless told to show what happens without.
		if !h.o.PGAsyncCommit {
			if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_commit = on`); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
				return err
			}
		}
		fi, err := os.Stat(h.pg.data)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		h.pg.uid, h.pg.gid = st.Uid, st.Gid
	}
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, region := range config.DefaultRegions {
		name := "assay_chaos_" + region + "_" + stamp
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("create database %s: %w", name, err)
		}
		h.dbName[region] = name
		u, err := url.Parse(h.baseURL)
		if err != nil {
			return err
		}
		u.Path = "/" + name
		h.dbURL[region] = u.String()
		cfg, err := pgxpool.ParseConfig(withParam(h.dbURL[region], "application_name", "chaos-harness"))
		if err != nil {
			return err
		}
		cfg.MaxConns = 4
		if h.pool[region], err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return err
		}
	}
	return nil
}

// restartPostgres stops the server the way a crash would (immediate) and
// starts it again on the same port.
func (h *Harness) restartPostgres(ctx context.Context) error {
	p := h.pg
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, "pg_ctl"), "restart", "-m", "immediate", "-w", "-t", "60",
		"-D", p.data, "-l", filepath.Join(filepath.Dir(p.data), "restart.log"))
	cmd.Dir = filepath.Dir(p.data)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid}}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "HOME=/")
	// The postmaster inherits the output pipe; do not wait for it to close.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		return fmt.Errorf("pg_ctl restart: %w\n%s", err, out)
	}
	return nil
}

func (h *Harness) startNATS(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	mport, err := freePort()
	if err != nil {
		return err
	}
	h.natsStore = filepath.Join(h.dir, "nats")
	h.natsURL = "nats://" + addr(port)
	h.nats = &proc{name: "nats-server", bin: h.bins["nats-server"],
		args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mport),
			"-js", "-sd", h.natsStore},
		env: os.Environ(), logPath: filepath.Join(h.dir, "nats-server.log"),
		ready: "http://" + addr(mport) + "/healthz?js-enabled-only=true"}
	if err := h.nats.start(); err != nil {
		return err
	}
	return h.nats.waitReady(ctx, 30*time.Second)
}

func (h *Harness) startSim() error {
	h.sim = sim.New(sim.Options{Latency: h.o.SimLatency})
	regionOf := map[string]string{}
	for _, t := range h.tenantList() {
		regionOf[t.ID] = t.Region
	}
	h.front = newSimFront(h.sim, regionOf)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h.simURL = "http://" + ln.Addr().String()
	h.simSrv = &http.Server{Handler: h.front, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 90 * time.Second}
	go func() { _ = h.simSrv.Serve(ln) }()
	return nil
}

// startGitHub starts the fake GitHub API and writes the app's key.
func (h *Harness) startGitHub() error {
	key, err := rsa.GenerateKey(crand.Reader, 2048)
	if err != nil {
		return err
	}
	h.ghKey = filepath.Join(h.dir, "github-app.pem")
	if err := os.WriteFile(h.ghKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	h.gh = fakegithub.New()
	return nil
}

// tenantList makes the tenants once: Options.Tenants of them, homed in
// turn in each region.
func (h *Harness) tenantList() []tenant {
	if h.tenants == nil {
		for i := range h.o.Tenants {
			h.tenants = append(h.tenants, tenant{ID: fmt.Sprintf("tenant%d", i+1),
				Region: config.DefaultRegions[i%len(config.DefaultRegions)], Token: store.NewToken()})
		}
	}
	return h.tenants
}

// seed migrates both cells and gives every cell every tenant; the first
// tenant has a budget, so reservations are taken and settled under faults.
func (h *Harness) seed(ctx context.Context) error {
	var seeds []store.TenantSeed
	for _, t := range h.tenantList() {
		seeds = append(seeds, store.TenantSeed{ID: t.ID, HomeRegion: t.Region, Token: t.Token})
	}
	for _, region := range config.DefaultRegions {
		st, err := store.Open(ctx, h.dbURL[region])
		if err != nil {
			return err
		}
		_, err = st.Migrate(ctx)
		if err == nil {
			err = st.SeedTenants(ctx, seeds)
		}
		if err == nil {
			budget := int64(1_000_000_000) // $1000 a month: reserved and settled, never exhausted
			err = st.SetBudget(ctx, h.tenants[0].ID, &budget, "month")
		}
		// Each tenant's GitHub App installation covers the repositories
		// its code reviews name, so their outcomes are published.
		for i, t := range h.tenantList() {
			if err == nil {
				err = st.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: strconv.Itoa(1000 + i),
					Tenant: t.ID, Repositories: []string{"chaos/*"}})
			}
		}
		st.Close()
		if err != nil {
			return fmt.Errorf("seed %s: %w", region, err)
		}
	}
	return nil
}

func (h *Harness) startServices(ctx context.Context) error {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ASSAY_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	var order []string
	for _, region := range config.DefaultRegions {
		for _, svc := range services {
			for _, name := range h.instanceNames(svc, region) {
				if err := h.addService(name, svc, region, env); err != nil {
					return err
				}
				order = append(order, name)
			}
		}
	}
	for _, name := range order {
		if err := h.procs[name].start(); err != nil {
			return err
		}
	}
	for _, p := range h.procs {
		if err := p.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	nats := h.natsURL
	if h.cl != nil {
		nats = fmt.Sprintf("%d nodes in each cell", len(h.cl.cells[config.DefaultRegions[0]].nats))
	}
	h.logf("up: nats %s, sim %s, %d services, tenants %d over %s", nats, h.simURL, len(h.procs),
		len(h.tenants), strings.Join(config.DefaultRegions, "+"))
	return nil
}

// instanceNames are the processes of one service in a cell: one named for
// the service and region (ingress-us), a second ingress replica numbered
// from 2 (ingress-us-2), or in the cluster mode every one numbered from 1.
func (h *Harness) instanceNames(svc, region string) []string {
	if h.cl != nil {
		var out []string
		for i := range instances {
			out = append(out, fmt.Sprintf("%s-%s-%d", svc, region, i+1))
		}
		return out
	}
	out := []string{svc + "-" + region}
	if svc == "ingress" {
		for i := 2; i <= h.o.IngressReplicas; i++ {
			out = append(out, fmt.Sprintf("%s-%s-%d", svc, region, i))
		}
	}
	return out
}

// addService sets up one service process, not yet started: its own HTTP
// and metrics ports, the cell's database and NATS, the run's timings, and
// in the cluster mode its own links to every NATS node and both Postgres
// hosts, R3 streams placed by the cell's tag.
func (h *Harness) addService(name, svc, region string, env []string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	mport, err := freePort()
	if err != nil {
		return err
	}
	dbURL, natsURL := withParam(h.dbURL[region], "application_name", "chaos-"+name), h.natsURL
	e := append([]string(nil), env...)
	if h.cl != nil {
		c := h.cl.cells[region]
		if dbURL, err = h.serviceDBURL(c, name); err != nil {
			return err
		}
		if natsURL, err = h.serviceNATSURL(c, name); err != nil {
			return err
		}
		e = append(e, "ASSAY_STREAM_REPLICAS=3", "ASSAY_STREAM_PLACEMENT=region:"+region)
	}
	e = append(e,
		"ASSAY_REGION="+region,
		"ASSAY_DATABASE_URL="+dbURL,
		"ASSAY_NATS_URL="+natsURL,
		"ASSAY_HTTP_ADDR="+addr(port),
		"ASSAY_METRICS_ADDR="+addr(mport))
	if svc == "classifier" {
		e = append(e, "ASSAY_MODEL_BASE_URL="+h.simURL+"/v1", "ASSAY_MODEL="+chaosModel)
	}
	if svc == "committer" {
		// The fake GitHub rations nothing, and a run makes far more
		// reviews an hour than GitHub's budget of an installation allows.
		e = append(e, "ASSAY_GITHUB_API_URL="+h.gh.URL, "ASSAY_GITHUB_APP_ID=1", "ASSAY_GITHUB_APP_KEY_FILE="+h.ghKey,
			"ASSAY_GITHUB_WRITES_PER_MINUTE=1000000", "ASSAY_GITHUB_WRITES_PER_HOUR=60000000")
	}
	if h.o.FastTimings {
		e = append(e, fastTimings...)
	}
	h.procs[name] = &proc{name: name, bin: h.bins[svc], env: e,
		logPath: filepath.Join(h.dir, name+".log"), ready: "http://" + addr(port) + "/readyz"}
	h.metricsURL[name] = "http://" + addr(mport)
	return nil
}

// running says where the services are.
func (h *Harness) running() Running {
	r := Running{Databases: map[string]string{}, Ingress: map[string][]string{}, Tokens: map[string]string{},
		NATSURL: h.natsURL, Sim: h.sim}
	for _, region := range config.DefaultRegions {
		r.Databases[region] = h.dbURL[region]
		for _, svc := range services {
			for _, name := range h.instanceNames(svc, region) {
				r.Targets = append(r.Targets, Target{Service: svc, Region: region, URL: h.metricsURL[name]})
				if svc == "ingress" {
					r.Ingress[region] = append(r.Ingress[region], strings.TrimSuffix(h.procs[name].ready, "/readyz"))
				}
			}
		}
	}
	for _, t := range h.tenantList() {
		if _, ok := r.Tokens[t.Region]; !ok {
			r.Tokens[t.Region] = t.Token
		}
	}
	return r
}

// ingressURL is a region's ingress base URL, each of its instances in
// turn, as a load balancer spreads requests (and a retry after a failed
// one goes to the next).
func (h *Harness) ingressURL(region string) string {
	names := h.instanceNames("ingress", region)
	n := h.ingressTurn.Add(1)
	return strings.TrimSuffix(h.procs[names[n%uint64(len(names))]].ready, "/readyz")
}

// tearDown stops everything setUp started. Logs are kept when keep is set.
func (h *Harness) tearDown(keep bool) {
	var wg sync.WaitGroup
	for _, p := range h.procs {
		wg.Add(1)
		go func(p *proc) { defer wg.Done(); _ = p.stop() }(p)
	}
	wg.Wait()
	if h.nats != nil {
		_ = h.nats.stop()
	}
	h.tearDownCluster()
	if h.simSrv != nil {
		_ = h.simSrv.Close()
	}
	if h.sim != nil {
		_ = h.sim.Close()
	}
	if h.gh != nil {
		h.gh.Close()
	}
	for _, p := range h.pool {
		p.Close()
	}
	if h.pg != nil {
		_ = h.pg.cluster.Stop()
	} else if len(h.dbName) > 0 && h.cl == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if conn, err := pgx.Connect(ctx, h.baseURL); err == nil {
			for _, db := range h.dbName {
				_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
			}
			conn.Close(ctx)
		}
		cancel()
	}
	if h.dir != "" && !keep {
		_ = os.RemoveAll(h.dir)
	} else if h.dir != "" {
		_ = os.Remove(filepath.Join(h.dir, "owner.pid")) // kept on purpose: not for the reaper
	}
}

// reapRunDirs removes what runs killed before their tear-down left in the
// temporary directory: a run's directory whose owner is gone. Its
// processes died with it (they all have a parent-death signal); its data
// directories, stores and logs did not.
func reapRunDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "assay-chaos-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue // kept on purpose (-keep), or from before owners were written
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}

// withParam adds a query parameter to a postgres:// URL.
func withParam(u, k, v string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	q := p.Query()
	q.Set(k, v)
	p.RawQuery = q.Encode()
	return p.String()
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return p.Redacted()
}

// chaosModel is the model the classifiers ask the simulated provider for;
// the default price table prices it, in the services and in the checks.
const chaosModel = "assay-sim-1"
