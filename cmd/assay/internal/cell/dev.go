package cell

import (
	"context"
	"errors"
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
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
)

// Dev is what the all-in-one dev mode starts around the cells: NATS
// in-process, Postgres (throwaway unless ASSAY_DATABASE_URL is set), the
// simulated provider (unless ASSAY_MODEL_BASE_URL is set), and a cell per
// region of ASSAY_REGIONS (default us and eu), each with its own database.
type Dev struct {
	dir    string
	NATS   *server.Server
	pg     *devpg.Cluster
	baseDB string
	dbs    []string
	// Sim is the simulated provider; nil when a real endpoint is set.
	Sim      *sim.Server
	ModelURL string
	// Regions are the regions run, in order, and Cells their cells.
	Regions []string
	Cells   map[string]*Cell
	// Tenants are the demo tenants, with their tokens.
	Tenants []store.TenantSeed
	Log     *slog.Logger

	WebhookSecret string
}

// DevOptions configure the dev mode.
type DevOptions struct {
	LogTo io.Writer
	Level slog.Level
}

// StartDev starts the dev mode. A bad setting stops it before anything
// runs, with an error config.IsInvalid reports. On an error the Dev it
// returns, if any, must still be stopped.
func StartDev(ctx context.Context, o DevOptions) (e *Dev, err error) {
	e = &Dev{Cells: map[string]*Cell{}, Log: telemetry.NewLogger(o.LogTo, "dev", "", o.Level)}
	// Settings first: a bad one stops start-up before anything runs.
	var ccfg classifier.Config
	if err := ccfg.FromEnv(os.Getenv); err != nil {
		return e, config.Invalid(err)
	}
	var icfg ingress.Config
	if err := icfg.FromEnv(os.Getenv); err != nil {
		return e, config.Invalid(err)
	}
	// The committer's publisher records what it would publish unless a
	// GitHub App is configured.
	var mcfg committer.Config
	if err := mcfg.FromEnv(os.Getenv); err != nil {
		return e, config.Invalid(err)
	}
	model := "assay-sim-1"
	if u := os.Getenv("ASSAY_MODEL_BASE_URL"); u != "" {
		if p, err := url.Parse(u); err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https") {
			return e, config.Invalid(fmt.Errorf("ASSAY_MODEL_BASE_URL: %q is not an http(s) URL", u))
		}
		// A real endpoint has no default model.
		if model = os.Getenv("ASSAY_MODEL"); model == "" {
			return e, config.Invalid(errors.New("ASSAY_MODEL: required with ASSAY_MODEL_BASE_URL: the model name the endpoint serves (e.g. gpt-4o-mini)"))
		}
	} else if m := os.Getenv("ASSAY_MODEL"); m != "" {
		model = m
	}
	if u := os.Getenv("ASSAY_DATABASE_URL"); u != "" {
		if _, err := pgx.ParseConfig(u); err != nil {
			return e, config.Invalid(fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %v", err))
		}
	}
	e.Regions = config.DefaultRegions
	if v := os.Getenv("ASSAY_REGIONS"); v != "" {
		if e.Regions, err = config.ParseRegions(v); err != nil {
			return e, config.Invalid(fmt.Errorf("ASSAY_REGIONS: %w", err))
		}
	}
	if e.dir, err = os.MkdirTemp("", "assay-dev-"); err != nil {
		return nil, err
	}
	if e.NATS, err = StartNATS(e.dir + "/nats"); err != nil {
		return e, err
	}

	e.baseDB = os.Getenv("ASSAY_DATABASE_URL")
	if e.baseDB == "" {
		if e.pg, err = devpg.Start(ctx, ""); err != nil {
			return e, fmt.Errorf("throwaway postgres (set ASSAY_DATABASE_URL to use a running server): %w", err)
		}
		e.baseDB = e.pg.URL("postgres")
	}

	e.ModelURL = os.Getenv("ASSAY_MODEL_BASE_URL")
	if e.ModelURL == "" {
		e.Sim = sim.New(sim.Options{Logger: e.Log.With("service", "sim")})
		if e.ModelURL, err = e.Sim.Start("127.0.0.1:0"); err != nil {
			return e, fmt.Errorf("simulated provider: %w", err)
		}
	}

	e.Tenants = []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: store.NewToken()},
		{ID: "globex", HomeRegion: "eu", Token: store.NewToken()},
	}
	// Webhooks need a secret; dev makes one up unless one is given.
	if e.WebhookSecret = icfg.GitHubSecret; e.WebhookSecret == "" {
		e.WebhookSecret = store.NewToken()
		icfg.GitHubSecret = e.WebhookSecret
	}
	stamp := time.Now().UnixNano()
	for _, region := range e.Regions {
		dbURL, err := e.createDB(ctx, fmt.Sprintf("assay_dev_%s_%d", strings.ReplaceAll(region, "-", "_"), stamp))
		if err != nil {
			return e, err
		}
		cfg := config.Config{Regions: e.Regions, Region: region, Cell: region, Installation: "assay",
			DatabaseURL: dbURL, NATSURL: e.NATS.ClientURL(),
			ModelBaseURL: e.ModelURL, ModelAPIKey: os.Getenv("ASSAY_MODEL_API_KEY"),
			Model: model, HTTPAddr: "127.0.0.1:0"}
		c, err := Start(ctx, Options{Config: cfg, Log: e.Log.With("region", region), Prices: ccfg.Prices, Classifier: ccfg,
			Ingress: icfg, Committer: mcfg})
		if err != nil {
			return e, fmt.Errorf("cell %s: %w", region, err)
		}
		e.Cells[region] = c
		// Every cell knows every tenant, so a request sent to the wrong
		// cell is refused with the right region named.
		if err := c.Env.Store.SeedTenants(ctx, e.Tenants); err != nil {
			return e, err
		}
		for _, t := range e.Tenants {
			if err := c.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubRepository, Key: t.ID + "/shop", Tenant: t.ID}); err != nil {
				return e, err
			}
		}
	}
	return e, nil
}

// createDB makes a fresh database on the dev server for one cell.
func (e *Dev) createDB(ctx context.Context, name string) (string, error) {
	u, err := CreateDatabase(ctx, e.baseDB, name)
	if err == nil {
		e.dbs = append(e.dbs, name)
	}
	return u, err
}

// StartNATS starts an embedded nats-server with JetStream on a free port,
// its store in dir.
func StartNATS(dir string) (*server.Server, error) {
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

// CreateDatabase creates database name on the server of base and returns
// its URL.
func CreateDatabase(ctx context.Context, base, name string) (string, error) {
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

// DropDatabases drops the databases on the server of base, best effort.
func DropDatabases(ctx context.Context, base string, names ...string) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, db := range names {
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	}
}

// Stop stops everything StartDev started, cells first.
func (e *Dev) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range e.Cells {
		c.Stop(ctx)
	}
	if e.Sim != nil {
		_ = e.Sim.Close()
	}
	if e.NATS != nil {
		e.NATS.Shutdown()
		e.NATS.WaitForShutdown()
	}
	if e.pg != nil {
		_ = e.pg.Stop()
	} else if len(e.dbs) > 0 {
		DropDatabases(ctx, e.baseDB, e.dbs...)
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

// Token is a demo tenant's token.
func (e *Dev) Token(tenant string) string {
	for _, t := range e.Tenants {
		if t.ID == tenant {
			return t.Token
		}
	}
	return ""
}

// PrintEndpoints prints each cell's endpoints and the demo tenants' tokens.
func (e *Dev) PrintEndpoints(w io.Writer) {
	fmt.Fprintf(w, "assay dev: cells %s are up (Ctrl-C stops everything)\n", strings.Join(e.Regions, ", "))
	fmt.Fprintf(w, "  NATS (embedded, JetStream)  %s\n", e.NATS.ClientURL())
	if e.pg != nil {
		fmt.Fprintf(w, "  Postgres (throwaway)        %s\n", e.baseDB)
	}
	model := e.ModelURL
	if e.Sim != nil {
		model += "  (simulated provider; stats at " + e.ModelURL + "/sim/stats)"
	}
	fmt.Fprintf(w, "  model                       %s\n", model)
	for _, region := range e.Regions {
		c := e.Cells[region]
		fmt.Fprintf(w, "\n  cell %s (database %s)\n", region, config.Redacted(c.Env.Config.DatabaseURL))
		for _, p := range []string{"POST /v1/work", "GET  /v1/work/{id}", "POST /v1/webhooks/github", "GET  /v1/usage", "GET  /healthz", "GET  /readyz", "GET  /metrics"} {
			verb, path, _ := strings.Cut(p, " ")
			fmt.Fprintf(w, "    %-5s %s%s\n", verb, c.URL, strings.TrimSpace(path))
		}
	}
	fmt.Fprintf(w, "\n  GitHub webhooks: secret %s; repositories acme/shop and globex/shop are linked to their tenants\n", e.WebhookSecret)
	fmt.Fprintln(w, "\n  tenants")
	for _, t := range e.Tenants {
		fmt.Fprintf(w, "    %-7s home %s  token %s\n", t.ID, t.HomeRegion, t.Token)
	}
	t := e.Tenants[0]
	fmt.Fprintf(w, "\n  try:\n    curl -s -X POST %s/v1/work -H 'Authorization: Bearer %s' \\\n"+
		"      -d '{\"contract\":\"moderation\",\"sourceId\":\"forum/post#1\",\"revision\":\"r1\",\"input\":{\"text\":\"buy now, free money\"}}'\n",
		e.Cells[t.HomeRegion].URL, t.Token)
}
