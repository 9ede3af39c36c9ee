package cell

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/model"
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
	Sim     *sim.Server
	simRoot string
	// ModelURL is the model's base URL (ASSAY_MODEL_BASE_URL, or the
	// simulated provider's), ModelEndpoint the chat-completions URL when
	// ASSAY_MODEL_ENDPOINT gives it.
	ModelURL, ModelEndpoint string
	// Regions are the regions run, in order, and Cells their cells.
	Regions []string
	Cells   map[string]*Cell
	// Tenants are the demo tenants, with their tokens.
	Tenants []store.TenantSeed
	Log     *slog.Logger

	WebhookSecret string
	// OperatorToken reads the console of every cell.
	OperatorToken string
	// Secrets says where the tokens and the webhook secret were kept, ""
	// when they were made for this run only.
	Secrets string
}

// DevOptions configure the dev mode.
type DevOptions struct {
	LogTo io.Writer
	Level slog.Level
	// Addrs, when set, are the cells' listen addresses in region order;
	// one that is taken (or missing) falls back to a free port.
	Addrs []string
	// Secrets, when set, is a file that keeps the demo tenants' tokens,
	// the operator token and the webhook secret from one run to the next
	// (mode 0600, made on the first run).
	Secrets string
}

// devSecrets are what a dev mode's callers hold: kept in DevOptions.Secrets
// so that a second run answers the same tokens.
type devSecrets struct {
	Tokens        map[string]string `json:"tokens"`
	OperatorToken string            `json:"operatorToken"`
	WebhookSecret string            `json:"webhookSecret"`
}

// loadSecrets reads file's secrets, making any it lacks (and the file,
// when it is missing); an empty file name makes them for this run.
func loadSecrets(file string, tenants ...string) (devSecrets, error) {
	var s devSecrets
	if file != "" {
		if raw, err := os.ReadFile(file); err == nil {
			if err := json.Unmarshal(raw, &s); err != nil {
				return s, fmt.Errorf("%s: %w (remove it for new tokens)", file, err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return s, err
		}
	}
	changed := false
	fill := func(v *string) {
		if !store.ValidToken(*v) {
			*v, changed = store.NewToken(), true
		}
	}
	if s.Tokens == nil {
		s.Tokens = map[string]string{}
	}
	for _, t := range tenants {
		tok := s.Tokens[t]
		fill(&tok)
		s.Tokens[t] = tok
	}
	fill(&s.OperatorToken)
	fill(&s.WebhookSecret)
	if file == "" || !changed {
		return s, nil
	}
	raw, _ := json.MarshalIndent(s, "", "  ")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return s, err
	}
	return s, os.WriteFile(file, append(raw, '\n'), 0o600)
}

// devSettings are the dev mode's settings from the environment, checked.
type devSettings struct {
	classifier classifier.Config
	ingress    ingress.Config
	committer  committer.Config
	// model is the model asked for; base and endpoint are
	// ASSAY_MODEL_BASE_URL and ASSAY_MODEL_ENDPOINT, "" for the
	// simulated provider.
	model, base, endpoint string
}

// devSettingsFromEnv reads and checks the dev mode's settings; a bad one
// is an error config.IsInvalid reports.
func devSettingsFromEnv() (devSettings, error) {
	var s devSettings
	if err := s.classifier.FromEnv(os.Getenv); err != nil {
		return s, config.Invalid(err)
	}
	if err := s.ingress.FromEnv(os.Getenv); err != nil {
		return s, config.Invalid(err)
	}
	// The committer's publisher records what it would publish unless a
	// GitHub App is configured.
	if err := s.committer.FromEnv(os.Getenv); err != nil {
		return s, config.Invalid(err)
	}
	s.model = "assay-sim-1"
	s.base, s.endpoint = os.Getenv("ASSAY_MODEL_BASE_URL"), os.Getenv("ASSAY_MODEL_ENDPOINT")
	if s.base != "" || s.endpoint != "" {
		// A real endpoint: checked as the classifier checks it, and it
		// has no default model.
		s.model = os.Getenv("ASSAY_MODEL")
		if errs := config.CheckModel(s.base, s.endpoint, s.model); len(errs) > 0 {
			return s, config.Invalid(errors.Join(errs...))
		}
	} else if m := os.Getenv("ASSAY_MODEL"); m != "" {
		s.model = m
	}
	if u := os.Getenv("ASSAY_DATABASE_URL"); u != "" {
		if _, err := pgx.ParseConfig(u); err != nil {
			return s, config.Invalid(fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %s", config.Scrub(err.Error(), u)))
		}
	}
	return s, nil
}

// StartDev starts the dev mode. A bad setting stops it before anything
// runs, with an error config.IsInvalid reports. On an error the Dev it
// returns, if any, must still be stopped.
func StartDev(ctx context.Context, o DevOptions) (e *Dev, err error) {
	e = &Dev{Cells: map[string]*Cell{}, Log: telemetry.NewLogger(o.LogTo, "dev", "", o.Level)}
	// Settings first: a bad one stops start-up before anything runs.
	s, err := devSettingsFromEnv()
	if err != nil {
		return e, err
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

	e.ModelURL, e.ModelEndpoint = s.base, s.endpoint
	if s.base == "" && s.endpoint == "" {
		e.Sim = sim.New(sim.Options{Logger: e.Log.With("service", "sim")})
		if e.simRoot, err = e.Sim.Start("127.0.0.1:0"); err != nil {
			return e, fmt.Errorf("simulated provider: %w", err)
		}
		e.ModelURL = sim.APIBase(e.simRoot)
	}

	sec, err := loadSecrets(o.Secrets, "acme", "globex")
	if err != nil {
		return e, fmt.Errorf("dev tokens: %w", err)
	}
	e.Secrets, e.OperatorToken = o.Secrets, sec.OperatorToken
	e.Tenants = []store.TenantSeed{
		{ID: "acme", HomeRegion: "us", Token: sec.Tokens["acme"]},
		{ID: "globex", HomeRegion: "eu", Token: sec.Tokens["globex"]},
	}
	// Webhooks need a secret; dev makes one up unless one is given.
	if e.WebhookSecret = s.ingress.GitHubSecret; e.WebhookSecret == "" {
		e.WebhookSecret = sec.WebhookSecret
		s.ingress.GitHubSecret = e.WebhookSecret
	}
	stamp := time.Now().UnixNano()
	for i, region := range e.Regions {
		if err := e.startCell(ctx, s, i, region, o.Addrs, stamp); err != nil {
			return e, err
		}
	}
	return e, nil
}

// startCell starts region's cell, the i-th, on a database of its own and
// the i-th of addrs (see devAddr), and gives it every demo tenant, the
// operator token and the tenants' repository links.
func (e *Dev) startCell(ctx context.Context, s devSettings, i int, region string, addrs []string, stamp int64) error {
	dbURL, err := e.createDB(ctx, fmt.Sprintf("assay_dev_%s_%d", strings.ReplaceAll(region, "-", "_"), stamp))
	if err != nil {
		return err
	}
	cfg := config.Config{Regions: e.Regions, Region: region, Cell: region, Installation: "assay",
		DatabaseURL: dbURL, NATSURL: e.NATS.ClientURL(),
		ModelBaseURL: e.ModelURL, ModelEndpoint: e.ModelEndpoint, ModelAPIKey: os.Getenv("ASSAY_MODEL_API_KEY"),
		Model: s.model, HTTPAddr: devAddr(addrs, i)}
	c, err := Start(ctx, Options{Config: cfg, Log: e.Log.With("region", region), Prices: s.classifier.Prices, Classifier: s.classifier,
		Ingress: s.ingress, Committer: s.committer})
	if err != nil {
		return fmt.Errorf("cell %s: %w", region, err)
	}
	e.Cells[region] = c
	// Every cell knows every tenant, so a request sent to the wrong
	// cell is refused with the right region named.
	if err := c.Env.Store.SeedTenants(ctx, e.Tenants); err != nil {
		return err
	}
	if err := c.Env.Store.AddOperatorToken(ctx, "dev", e.OperatorToken); err != nil {
		return err
	}
	for _, t := range e.Tenants {
		if err := c.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubRepository, Key: t.ID + "/shop", Tenant: t.ID}); err != nil {
			return err
		}
	}
	return nil
}

// devAddr is cell i's listen address: the one asked for while it is free,
// else a free port.
func devAddr(addrs []string, i int) string {
	if i >= len(addrs) || addrs[i] == "" {
		return "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addrs[i])
	if err != nil {
		return "127.0.0.1:0"
	}
	ln.Close()
	return addrs[i]
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

// ChatURL is where the cells' classifiers post chat completions.
func (e *Dev) ChatURL() string {
	return (&model.Client{BaseURL: e.ModelURL, Endpoint: e.ModelEndpoint}).ChatURL()
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

// PrintEndpoints prints what a person needs to use the cells by hand:
// each cell's endpoints, the tokens, and the line that sets CELL and TOKEN
// for the README's examples (assay-dev dev --serve prints its own export line
// for assay's commands after it).
func (e *Dev) PrintEndpoints(w io.Writer) {
	fmt.Fprintf(w, "assay-dev dev: cells %s are up (Ctrl-C stops everything)\n", strings.Join(e.Regions, ", "))
	fmt.Fprintf(w, "  NATS (embedded, JetStream)  %s\n", e.NATS.ClientURL())
	if e.pg != nil {
		fmt.Fprintf(w, "  Postgres (throwaway)        %s\n", e.baseDB)
	}
	model := "POST " + config.Redacted(e.ChatURL())
	if e.Sim != nil {
		model += "  (simulated provider; stats at " + e.simRoot + "/sim/stats)"
	}
	fmt.Fprintf(w, "  model                       %s\n", model)
	for _, region := range e.Regions {
		c := e.Cells[region]
		fmt.Fprintf(w, "\n  cell %s  %s  (database %s)\n", region, c.URL, config.Redacted(c.Env.Config.DatabaseURL))
		for _, p := range devEndpoints {
			fmt.Fprintf(w, "    %-6s %-40s %s\n", p[0], p[1], p[2])
		}
		fmt.Fprintf(w, "    %-6s %-40s %s\n", "GET", c.MetricsURL+"/metrics", "Prometheus metrics, on a port of their own (never the API's)")
	}
	fmt.Fprintf(w, "\n  GitHub webhooks: secret %s; repositories acme/shop and globex/shop are linked to their tenants\n", e.WebhookSecret)
	fmt.Fprintln(w, "\n  tokens")
	for _, t := range e.Tenants {
		fmt.Fprintf(w, "    %-9s %s  (tenant, home %s: %s)\n", t.ID, t.Token, t.HomeRegion, e.Cells[t.HomeRegion].URL)
	}
	fmt.Fprintf(w, "    %-9s %s  (operator: the console of every cell)\n", "operator", e.OperatorToken)
	if e.Secrets != "" {
		fmt.Fprintf(w, "    kept in %s: the next run answers the same ones (remove the file for new ones)\n", e.Secrets)
	}
	t := e.Tenants[0]
	fmt.Fprintf(w, "\n  console: %s/console (sign in with a token above)\n", e.Cells[t.HomeRegion].URL)
	fmt.Fprintf(w, "\n  for the README's examples (acme, in cell %s):\n    export CELL=%s TOKEN=%s OPERATOR_TOKEN=%s\n",
		t.HomeRegion, e.Cells[t.HomeRegion].URL, t.Token, e.OperatorToken)
	fmt.Fprintf(w, "    curl -s -X POST $CELL/v1/work -H \"Authorization: Bearer $TOKEN\" -d @deploy/examples/code-review.json\n")
}

// devEndpoints are the paths every cell serves, as PrintEndpoints lists
// them.
var devEndpoints = [][3]string{
	{"POST", "/v1/work", "submit work"},
	{"GET", "/v1/work[/{id}]", "list work; one item's state, attempts, result"},
	{"GET", "/v1/work/{id}/events", "one item's progress (server-sent events)"},
	{"POST", "/v1/batches", "submit a batch"},
	{"GET", "/v1/batches/{id}[/results|/events]", "a batch's counts, results, progress"},
	{"POST", "/v1/batches/{id}/cancel", "cancel a batch"},
	{"GET", "/v1/reviews", "the review queue"},
	{"POST", "/v1/reviews/{id}/resolve", "resolve a review item"},
	{"GET", "/v1/views", "work by the five states a reviewer tells apart"},
	{"GET", "/v1/usage", "calls, units and cost from the ledger"},
	{"POST", "/v1/webhooks/github", "GitHub deliveries (X-Hub-Signature-256)"},
	{"GET", "/console", "the live console (a tenant's or the operator token)"},
	{"GET", "/healthz /readyz", "health, readiness"},
}
