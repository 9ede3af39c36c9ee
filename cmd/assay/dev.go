package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// devEnv is what `assay dev` starts around the cells: NATS in-process,
// Postgres (throwaway unless ASSAY_DATABASE_URL is set), the simulated
// provider (unless ASSAY_MODEL_BASE_URL is set).
type devEnv struct {
	dir      string
	nats     *server.Server
	pg       *devpg.Cluster
	baseDB   string
	dbs      []string
	sim      *sim.Server
	modelURL string
	cells    map[string]*cell
	tenants  []store.TenantSeed
	log      *slog.Logger

	webhookSecret string
}

type devOptions struct {
	LogTo io.Writer
	Level slog.Level
}

func dev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assay dev", flag.ContinueOnError)
	serve := fs.Bool("serve", false, "keep both cells running with the HTTP API up until interrupted")
	verbose := fs.Bool("v", false, "print the services' decision log to stderr")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	o := devOptions{LogTo: io.Discard, Level: slog.LevelInfo}
	if *verbose || *serve {
		o.LogTo = os.Stderr
	}
	e, err := startDev(ctx, o)
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		return err
	}
	if *serve {
		e.printEndpoints(os.Stdout)
		<-ctx.Done()
		fmt.Println("\nstopping…")
		return nil
	}
	return runDemo(ctx, e, os.Stdout)
}

func startDev(ctx context.Context, o devOptions) (e *devEnv, err error) {
	e = &devEnv{cells: map[string]*cell{}, log: telemetry.NewLogger(o.LogTo, "dev", "", o.Level)}
	// Settings first: a bad one stops start-up before anything runs.
	var ccfg classifier.Config
	if err := ccfg.FromEnv(os.Getenv); err != nil {
		return e, configError{err}
	}
	var icfg ingress.Config
	if err := icfg.FromEnv(os.Getenv); err != nil {
		return e, configError{err}
	}
	if u := os.Getenv("ASSAY_MODEL_BASE_URL"); u != "" {
		if p, err := url.Parse(u); err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https") {
			return e, configError{fmt.Errorf("ASSAY_MODEL_BASE_URL: %q is not an http(s) URL", u)}
		}
	}
	if u := os.Getenv("ASSAY_DATABASE_URL"); u != "" {
		if _, err := pgx.ParseConfig(u); err != nil {
			return e, configError{fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %v", err)}
		}
	}
	if e.dir, err = os.MkdirTemp("", "assay-dev-"); err != nil {
		return nil, err
	}
	if e.nats, err = startNATS(e.dir + "/nats"); err != nil {
		return e, err
	}

	e.baseDB = os.Getenv("ASSAY_DATABASE_URL")
	if e.baseDB == "" {
		if e.pg, err = devpg.Start(ctx, ""); err != nil {
			return e, fmt.Errorf("throwaway postgres (set ASSAY_DATABASE_URL to use a running server): %w", err)
		}
		e.baseDB = e.pg.URL("postgres")
	}

	e.modelURL = os.Getenv("ASSAY_MODEL_BASE_URL")
	if e.modelURL == "" {
		e.sim = sim.New(sim.Options{Logger: e.log.With("service", "sim")})
		if e.modelURL, err = e.sim.Start("127.0.0.1:0"); err != nil {
			return e, fmt.Errorf("simulated provider: %w", err)
		}
	}

	e.tenants = []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: store.NewToken()},
		{ID: "globex", HomeRegion: "eu", Token: store.NewToken()},
	}
	// Webhooks need a secret; dev makes one up unless one is given.
	if e.webhookSecret = icfg.GitHubSecret; e.webhookSecret == "" {
		e.webhookSecret = store.NewToken()
		icfg.GitHubSecret = e.webhookSecret
	}
	stamp := time.Now().UnixNano()
	for _, region := range config.Regions {
		dbURL, err := e.createDB(ctx, fmt.Sprintf("assay_dev_%s_%d", region, stamp))
		if err != nil {
			return e, err
		}
		cfg := config.Config{Region: region, DatabaseURL: dbURL, NATSURL: e.nats.ClientURL(),
			ModelBaseURL: e.modelURL, ModelAPIKey: os.Getenv("ASSAY_MODEL_API_KEY"),
			Model: envOr("ASSAY_MODEL", "assay-sim-1"), HTTPAddr: "127.0.0.1:0"}
		c, err := startCell(ctx, cellOptions{Config: cfg, Log: e.log.With("region", region), Prices: ccfg.Prices, Classifier: ccfg,
			Ingress: icfg})
		if err != nil {
			return e, fmt.Errorf("cell %s: %w", region, err)
		}
		e.cells[region] = c
		// Every cell knows every tenant, so a request sent to the wrong
		// cell is refused with the right region named.
		if err := c.Env.Store.SeedTenants(ctx, e.tenants); err != nil {
			return e, err
		}
		for _, t := range e.tenants {
			if err := c.Env.Store.LinkSource(ctx, "github_repository", t.ID+"/shop", t.ID); err != nil {
				return e, err
			}
		}
	}
	return e, nil
}

// createDB makes a fresh database on the dev server for one cell.
func (e *devEnv) createDB(ctx context.Context, name string) (string, error) {
	u, err := createDatabase(ctx, e.baseDB, name)
	if err == nil {
		e.dbs = append(e.dbs, name)
	}
	return u, err
}

// startNATS starts an embedded nats-server with JetStream on a free port,
// its store in dir.
func startNATS(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded nats did not start")
	}
	return ns, nil
}

// createDatabase creates database name on the server of base and returns
// its URL.
func createDatabase(ctx context.Context, base, name string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("ASSAY_DATABASE_URL: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// dropDatabases drops the databases on the server of base, best effort.
func dropDatabases(ctx context.Context, base string, names ...string) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, db := range names {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	}
}

// Stop stops everything startDev started, cells first.
func (e *devEnv) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range e.cells {
		c.Stop(ctx)
	}
	if e.sim != nil {
		_ = e.sim.Close()
	}
	if e.nats != nil {
		e.nats.Shutdown()
		e.nats.WaitForShutdown()
	}
	if e.pg != nil {
		_ = e.pg.Stop()
	} else if len(e.dbs) > 0 {
		dropDatabases(ctx, e.baseDB, e.dbs...)
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

func (e *devEnv) token(tenant string) string {
	for _, t := range e.tenants {
		if t.ID == tenant {
			return t.Token
		}
	}
	return ""
}

func (e *devEnv) printEndpoints(w io.Writer) {
	fmt.Fprintln(w, "assay dev: both cells are up (Ctrl-C stops everything)")
	fmt.Fprintf(w, "  NATS (embedded, JetStream)  %s\n", e.nats.ClientURL())
	if e.pg != nil {
		fmt.Fprintf(w, "  Postgres (throwaway)        %s\n", e.baseDB)
	}
	model := e.modelURL
	if e.sim != nil {
		model += "  (simulated provider; stats at " + e.modelURL + "/sim/stats)"
	}
	fmt.Fprintf(w, "  model                       %s\n", model)
	for _, region := range config.Regions {
		c := e.cells[region]
		fmt.Fprintf(w, "\n  cell %s\n", region)
		for _, p := range []string{"POST /v1/work", "GET  /v1/work/{id}", "POST /v1/webhooks/github", "GET  /v1/usage", "GET  /healthz", "GET  /readyz", "GET  /metrics"} {
			verb, path, _ := strings.Cut(p, " ")
			fmt.Fprintf(w, "    %-5s %s%s\n", verb, c.URL, strings.TrimSpace(path))
		}
	}
	fmt.Fprintf(w, "\n  GitHub webhooks: secret %s; repositories acme/shop and globex/shop are linked to their tenants\n", e.webhookSecret)
	fmt.Fprintln(w, "\n  tenants")
	for _, t := range e.tenants {
		fmt.Fprintf(w, "    %-7s home %s  token %s\n", t.ID, t.HomeRegion, t.Token)
	}
	t := e.tenants[0]
	fmt.Fprintf(w, "\n  try:\n    curl -s -X POST %s/v1/work -H 'Authorization: Bearer %s' \\\n"+
		"      -d '{\"contract\":\"moderation\",\"sourceId\":\"forum/post#1\",\"revision\":\"r1\",\"input\":{\"text\":\"buy now, free money\"}}'\n",
		e.cells[t.HomeRegion].URL, t.Token)
}
