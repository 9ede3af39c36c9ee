// Package host runs one assay service as a process: it reads the shared
// settings, connects to the cell's Postgres and NATS, applies migrations,
// serves /healthz, /readyz and /metrics beside the service's own API, and
// drains in order on SIGTERM.
package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/buildinfo"
	"assay.dev/pkg/config"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Env is what a service gets from its host.
type Env struct {
	Config    config.Config
	Store     *store.Store
	NC        *nats.Conn
	JS        jetstream.JetStream
	Contracts *contract.Registry
	Log       *slog.Logger
	Tel       *telemetry.Provider

	nats     natsHealth
	draining atomic.Bool

	// own are the service's own settings, name and value, whose
	// credentials what /readyz logs leaves out. Run sets them.
	own map[string]string

	refreshLabels func(context.Context)
	stopLabels    context.CancelFunc // ends the tenant labels' refresh
	labelsEnded   chan struct{}
}

// natsHealth remembers the last permissions violation the server told this
// connection of: a credential that may not do the service's job.
type natsHealth struct {
	mu        sync.Mutex
	violation string
	at        time.Time
	refused   chan struct{} // closed at the first violation
}

// violationMemory is how long a permissions violation keeps a service not
// ready after the server last reported one.
const violationMemory = time.Minute

func (h *natsHealth) record(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.violation == "" {
		close(h.refusedOnce())
	}
	h.violation, h.at = err.Error(), time.Now()
}

// refusedOnce is the channel closed at the first violation; h.mu is held.
func (h *natsHealth) refusedOnce() chan struct{} {
	if h.refused == nil {
		h.refused = make(chan struct{})
	}
	return h.refused
}

// firstRefusal is closed once the server has refused this credential
// anything.
func (h *natsHealth) firstRefusal() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refusedOnce()
}

func (h *natsHealth) recent() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.violation == "" || time.Since(h.at) > violationMemory {
		return ""
	}
	return h.violation
}

// Ready reports whether the Env can do a service's job: the database
// answers, the NATS connection is up, and the server has not refused this
// credential a subject lately. While the process drains it is not ready.
func (e *Env) Ready(ctx context.Context) error {
	if e.draining.Load() {
		return errors.New("draining: stopping on a signal")
	}
	if e.Store != nil {
		if err := e.Store.Ping(ctx); err != nil {
			return err
		}
	}
	if e.NC != nil {
		if st := e.NC.Status(); st != nats.CONNECTED {
			return fmt.Errorf("nats: connection %s", st)
		}
		if v := e.nats.recent(); v != "" {
			return fmt.Errorf("nats: the server refused this credential: %s", v)
		}
	}
	return nil
}

// redact is err's text with every credential of the service's settings
// left out: its URLs' (as config.Redacted finds them, whatever the
// setting), and the whole value of a setting named for a secret.
func (e *Env) redact(err error) string {
	c := e.Config
	settings := [][2]string{{"ASSAY_DATABASE_URL", c.DatabaseURL}, {"ASSAY_NATS_URL", c.NATSURL},
		{"ASSAY_MODEL_BASE_URL", c.ModelBaseURL}, {"ASSAY_MODEL_ENDPOINT", c.ModelEndpoint}, {"ASSAY_MODEL_API_KEY", c.ModelAPIKey}}
	for name, v := range e.own {
		settings = append(settings, [2]string{name, v})
	}
	return redactWith(config.RedactError(err).Error(), settings)
}

// redactWith is msg without the credentials of settings (each a name and
// a value): those config.Scrub finds in any value, and the whole value of
// a setting named for a secret.
func redactWith(msg string, settings [][2]string) string {
	values := make([]string, 0, len(settings))
	for _, s := range settings {
		values = append(values, s[1])
	}
	msg = config.Scrub(msg, values...)
	for _, s := range settings {
		if config.Secret(s[0], s[1]) {
			msg = strings.ReplaceAll(msg, s[1], "xxxxx")
		}
	}
	return msg
}

// Refusal is the permissions violation the server last reported, "" when
// none lately: why a start that timed out on JetStream did.
func (e *Env) Refusal() string { return e.nats.recent() }

// Part is a service as the host sees it: a lifecycle part that can say
// whether it is ready.
type Part interface {
	lifecycle.Service
	Ready(ctx context.Context) error
}

// Connect opens everything a service of a cell needs. It waits for
// Postgres and NATS with capped backoff up to cfg.StartupWait, logging each
// try; creates the cell's database when it does not exist and the role
// may; applies migrations; and logs what it did.
func Connect(ctx context.Context, name string, cfg config.Config, log *slog.Logger, opts ...telemetry.Option) (*Env, error) {
	tel, err := telemetry.Setup(ctx, name, cfg.Region, append([]telemetry.Option{telemetry.WithTenantLabels(cfg.MetricsTenants), telemetry.WithCell(cfg.Cell)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	reg, err := contract.Load()
	if err != nil {
		return nil, err
	}
	e := &Env{Config: cfg, Contracts: reg, Log: log, Tel: tel}
	err = retry(ctx, log, "postgres", config.Redacted(cfg.DatabaseURL), cfg.StartupWait, func(ctx context.Context) error {
		if created, err := store.EnsureDatabase(ctx, cfg.DatabaseURL); err != nil {
			return config.RedactError(err, cfg.DatabaseURL)
		} else if created {
			log.Info("database created", "database", databaseName(cfg.DatabaseURL))
		}
		e.Store, err = store.Open(ctx, cfg.DatabaseURL, store.Options{MaxConns: cfg.DatabasePool})
		return config.RedactError(err, cfg.DatabaseURL)
	})
	if err != nil {
		return nil, fmt.Errorf("ASSAY_DATABASE_URL: %w%s", err, waited(cfg.StartupWait))
	}
	applied, err := e.Store.Migrate(ctx)
	if err != nil {
		e.Store.Close()
		return nil, err
	}
	versions := store.Versions()
	log.Info("migrations", "applied", len(applied), "names", strings.Join(applied, ","), "schema", versions[len(versions)-1])
	e.labelTenants(ctx)
	err = retry(ctx, log, "nats", config.Redacted(cfg.NATSURL), cfg.StartupWait, func(context.Context) error {
		e.NC, err = nats.Connect(cfg.NATSURL, nats.Name("assay-"+name+"-"+cfg.Region),
			nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
			nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
				subject := ""
				if sub != nil {
					subject = sub.Subject
				}
				// Logged before it is recorded: a refusal recorded during the
				// start ends the process, which must have said why first.
				log.Error("nats: asynchronous error", "err", err, "subject", subject)
				if errors.Is(err, nats.ErrPermissionViolation) {
					e.nats.record(err)
				}
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				// A nil error is this process closing its connection.
				if err != nil {
					log.Warn("nats: disconnected", "err", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats: reconnected", "server", config.Redacted(nc.ConnectedUrl())) }),
		)
		return config.RedactError(err, cfg.NATSURL)
	})
	if err != nil {
		e.Store.Close()
		return nil, fmt.Errorf("ASSAY_NATS_URL: connect %s: %w%s", config.Redacted(cfg.NATSURL), err, waited(cfg.StartupWait))
	}
	log.Info("nats: connected", "server", config.Redacted(e.NC.ConnectedUrl()), "max_payload", e.NC.MaxPayload())
	// Without JetStream every stream call would answer "no responders";
	// waiting longer cannot change that.
	if on, _ := e.NC.ConnectedServerJetStream(); !on {
		url := config.Redacted(e.NC.ConnectedUrl())
		e.NC.Close()
		e.Store.Close()
		return nil, fmt.Errorf("ASSAY_NATS_URL: JetStream is not enabled on %s (start nats-server with -js, or enable it in its configuration)", url)
	}
	if e.JS, err = jetstream.New(e.NC); err != nil {
		e.NC.Close()
		e.Store.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	e.startLabelRefresh(ctx)
	return e, nil
}

// TenantLabelsEvery is how often the tenants with a metric label of their
// own are read again: a tenant added within the cap gets its label on
// every instance within it.
const TenantLabelsEvery = 30 * time.Second

// labelTenants gives the cell's first ASSAY_METRICS_TENANTS tenants, as
// its database orders them, a metric label of their own, now and every
// TenantLabelsEvery until Close: the same tenants on every instance, where
// an order of first sight would differ from replica to replica.
func (e *Env) labelTenants(ctx context.Context) {
	load := func(ctx context.Context) {
		ids, err := e.Store.FirstTenants(ctx, e.Tel.TenantLabels())
		if err != nil {
			e.Log.Warn("tenant labels not read; the last list stays", "err", err)
			return
		}
		e.Tel.LabelTenants(ids)
	}
	load(ctx)
	e.refreshLabels = load
}

// startLabelRefresh reads the tenant labels again every TenantLabelsEvery
// until Close.
func (e *Env) startLabelRefresh(ctx context.Context) {
	load := e.refreshLabels
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.stopLabels, e.labelsEnded = cancel, make(chan struct{})
	go func() {
		defer close(e.labelsEnded)
		t := time.NewTicker(TenantLabelsEvery)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				load(lctx)
			}
		}
	}()
}

// retry runs try until it succeeds or wait has passed, backing off from
// 250ms to 5s and logging each failure with what it waits for and where
// (target, a URL fit for a log). wait 0 tries once.
func retry(ctx context.Context, log *slog.Logger, what, target string, wait time.Duration, try func(context.Context) error) error {
	deadline := time.Now().Add(wait)
	delay := 250 * time.Millisecond
	for n := 1; ; n++ {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := try(tctx)
		cancel()
		if err == nil {
			return nil
		}
		if !time.Now().Add(delay).Before(deadline) || ctx.Err() != nil {
			return err
		}
		log.Warn("waiting for "+what, "url", target, "try", n, "err", err, "retry_in", delay.String(),
			"gives_up_in", time.Until(deadline).Round(time.Second).String())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// waited says how long start-up tried before it gave up.
func waited(wait time.Duration) string {
	if wait <= 0 {
		return " (tried once: ASSAY_STARTUP_WAIT is 0)"
	}
	return fmt.Sprintf(" (tried for %s: ASSAY_STARTUP_WAIT)", wait)
}

func databaseName(u string) string {
	if cfg, err := pgx.ParseConfig(u); err == nil {
		return cfg.Database
	}
	return ""
}

// Close releases connections, last to first.
func (e *Env) Close(ctx context.Context) {
	if e.stopLabels != nil {
		e.stopLabels()
		<-e.labelsEnded
	}
	if e.NC != nil {
		_ = e.NC.Drain()
	}
	if e.Store != nil {
		e.Store.Close()
	}
	if e.Tel != nil {
		_ = e.Tel.Shutdown(ctx)
	}
}

// Mux builds the HTTP surface every service has: its own API (may be nil),
// /healthz (the process answers, draining included) and /readyz (env and
// every part can do their job); anything else is a JSON 404 or 405,
// /metrics included, which only MetricsMux serves, on a listener of its
// own (ASSAY_METRICS_ADDR), since it names tenants and their outcomes. /readyz answers ready or not ready and nothing more, since anyone
// may ask it; why it is not ready goes to the log, once each time the
// reason changes.
func Mux(api http.Handler, env *Env, parts ...Part) http.Handler {
	mux := http.NewServeMux()
	if api != nil {
		mux.Handle("/v1/", api)
		// The console page ingress serves; another service's API answers
		// it not_found.
		mux.Handle("GET /console", api)
		mux.Handle("GET /console/", api)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		apierror.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	var mu sync.Mutex
	last := ""
	note := func(why string) {
		mu.Lock()
		changed := why != last
		last = why
		mu.Unlock()
		switch {
		case changed && why != "":
			env.Log.Warn("not ready", "err", why)
		case changed:
			env.Log.Info("ready")
		}
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		checks := append([]func(context.Context) error{env.Ready}, func(ctx context.Context) error {
			for _, p := range parts {
				if err := p.Ready(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		for _, check := range checks {
			if err := check(ctx); err != nil {
				note(env.redact(err))
				apierror.JSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
				return
			}
		}
		note("")
		apierror.JSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return apierror.JSONErrors(mux)
}

// MetricsMux serves /metrics alone, on ASSAY_METRICS_ADDR's listener;
// anything else is a JSON 404 or 405.
func MetricsMux(env *Env) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", env.Tel.MetricsHandler())
	return apierror.JSONErrors(mux)
}

// Limits bound what one HTTP client can hold. A request's headers must
// arrive within ReadHeader and the whole request, body included, within
// Read, so a slow body cannot hold a connection; a keep-alive connection
// idle for Idle is closed; no handler reads more than MaxRequestBytes of a
// body (the API's own limits are lower). A zero field takes its default.
type Limits struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxRequestBytes               int64
}

// DefaultLimits are 5s for headers, 15s for a request, 30s to write an
// answer, 60s idle and 4 MiB of body.
var DefaultLimits = Limits{ReadHeader: 5 * time.Second, Read: 15 * time.Second, Write: 30 * time.Second,
	Idle: 60 * time.Second, MaxRequestBytes: 4 << 20}

func (l Limits) orDefault() Limits {
	d := DefaultLimits
	return Limits{ReadHeader: cmp.Or(l.ReadHeader, d.ReadHeader), Read: cmp.Or(l.Read, d.Read), Write: cmp.Or(l.Write, d.Write),
		Idle: cmp.Or(l.Idle, d.Idle), MaxRequestBytes: cmp.Or(l.MaxRequestBytes, d.MaxRequestBytes)}
}

type drainingKey struct{}

// Draining is closed when the server that serves ctx's request shuts
// down: a long-lived answer (a server-sent event stream) ends then, so the
// drain does not wait for it. Outside Serve it is never closed.
func Draining(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainingKey{}).(<-chan struct{})
	return ch
}

// Serve listens on addr and serves h within lim until ctx ends, then shuts
// down. It returns the bound address through bound once listening.
func Serve(ctx context.Context, addr string, h http.Handler, lim Limits, bound func(string)) error {
	ln, err := Listen("ASSAY_HTTP_ADDR", addr)
	if err != nil {
		return err
	}
	if bound != nil {
		bound(ln.Addr().String())
	}
	return ServeOn(ctx, ln, h, lim)
}

// Listen binds addr, the value of the setting named setting; its error
// names both.
func Listen(setting, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", setting, addr, err)
	}
	return ln, nil
}

// ServeOn serves h on ln within lim until ctx ends, then shuts down.
func ServeOn(ctx context.Context, ln net.Listener, h http.Handler, lim Limits) error {
	lim = lim.orDefault()
	draining := make(chan struct{})
	srv := &http.Server{Handler: http.MaxBytesHandler(h, lim.MaxRequestBytes), ReadHeaderTimeout: lim.ReadHeader,
		ReadTimeout: lim.Read, WriteTimeout: lim.Write, IdleTimeout: lim.Idle,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), drainingKey{}, (<-chan struct{})(draining))
		}}
	// Shutdown waits for the requests in hand; a stream that would never
	// end on its own is told to end instead.
	srv.RegisterOnShutdown(func() { close(draining) })
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Spec describes one service binary for Run.
type Spec struct {
	Name string // "ingress", "classifier", …
	Doc  string // one line for --help
	Need config.Need
	// Vars are the service's own settings, for --help; Configure reads them
	// (before anything is connected) and its error is a bad setting.
	Vars      []config.Var
	Configure func(getenv func(string) string) error
	// Build makes the service from the Env, with its own API (may be nil).
	Build func(*Env) (Part, http.Handler, error)
}

// Run runs one service process. Exit codes: 0 after --help, --version or a
// clean stop; 2 for a bad setting; 1 for a failure. It logs the version
// and the effective settings (secrets redacted) at start, serves until
// SIGTERM or an interrupt, then drains — /healthz still answering, /readyz
// not ready — and logs what it stopped and how long that took.
func Run(spec Spec) {
	info := buildinfo.Read()
	cfg := configure(spec, info)
	log := telemetry.NewLogger(os.Stderr, spec.Name, cfg.Region, slog.LevelInfo)
	LogStart(log, spec, info, cfg, os.Getenv)
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	// The ports are bound before anything is connected: a port that is
	// taken stops start-up at once, and /healthz answers while the
	// service waits for Postgres and NATS (/readyz does not).
	front, back := &swapHandler{}, &swapHandler{}
	front.Store(starting(true))
	back.Store(starting(false))
	// The listeners outlive the drain, so probes keep their answers.
	hctx, stopHTTP := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 2)
	listeners := listen(hctx, log, spec.Name, cfg, front, back, served)
	env, part, api := startService(ctx, spec, cfg, log)
	env.own = ownValues(spec.Vars, os.Getenv)
	front.Store(Mux(api, env, part))
	back.Store(MetricsMux(env))
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	if err = drain(log, env, part, stopHTTP, served, listeners, err); err != nil {
		fail(log, spec.Name, err)
	}
}

// LogStart logs the line a service starts with: its version and build,
// the shared settings it runs with and its own, each value as
// config.RedactedSetting shows it.
func LogStart(log *slog.Logger, spec Spec, info buildinfo.Info, cfg config.Config, getenv func(string) string) {
	log.Info("starting", "version", info.Version, "revision", info.RevisionOrUnknown(), "go", info.GoVersion,
		"config", cfg.Redacted(), "settings", ownSettings(spec.Vars, getenv))
}

// configure loads the settings of spec's service and runs its Configure. It
// ends the process after --help or --version (0) and on a bad setting (2).
func configure(spec Spec, info buildinfo.Info) config.Config {
	cfg, out, code := Configure(spec, info, os.Args[1:], os.Getenv)
	switch code {
	case -1:
		return cfg
	case 0:
		fmt.Print(out)
	default:
		fmt.Fprint(os.Stderr, out)
	}
	os.Exit(code)
	return cfg
}

// Configure is what a service's process makes of its arguments and its
// environment before it connects: the settings it runs with and code -1,
// or what it prints and the code it exits with: the help or the version
// and 0, a bad setting's error and 2. No value in out carries a
// credential: a bad setting is named with its value redacted.
func Configure(spec Spec, info buildinfo.Info, args []string, getenv func(string) string) (cfg config.Config, out string, code int) {
	cfg, err := config.Load(spec.Name, args, getenv, spec.Need)
	switch {
	case errors.Is(err, config.ErrHelp):
		return cfg, config.Usage(spec.Name, spec.Doc, spec.Need, spec.Vars), 0
	case errors.Is(err, config.ErrVersion):
		return cfg, fmt.Sprintf("%s %s\n", spec.Name, info), 0
	case err == nil && spec.Configure != nil:
		err = spec.Configure(getenv)
	}
	if err != nil {
		// A check that quotes a value it refuses redacts it; this keeps
		// out what one that does not would quote.
		var settings [][2]string
		for _, v := range append(config.Shared(spec.Need), spec.Vars...) {
			settings = append(settings, [2]string{v.Name, getenv(v.Name)})
		}
		// A flag's value is named by its flag: --model-api-key=… or
		// --model-api-key ….
		flag := ""
		for _, a := range args {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") {
				settings, flag = append(settings, [2]string{k, v}), ""
			} else if strings.HasPrefix(a, "-") {
				flag = a
			} else {
				settings = append(settings, [2]string{flag, a})
			}
		}
		msg := redactWith(err.Error(), settings)
		return cfg, fmt.Sprintf("%s: %s\n(%s --help lists every setting)\n", spec.Name, msg, spec.Name), 2
	}
	return cfg, "", -1
}

// listen binds the API and metrics ports cfg sets and serves front and back
// on them until hctx ends, each server's end sent on served. It returns how
// many it serves; a port it cannot bind ends the process.
func listen(hctx context.Context, log *slog.Logger, name string, cfg config.Config, front, back http.Handler, served chan<- error) int {
	listeners := 0
	for _, l := range []struct {
		setting, addr, msg string
		h                  http.Handler
	}{{"ASSAY_HTTP_ADDR", cfg.HTTPAddr, "serving", front}, {"ASSAY_METRICS_ADDR", cfg.MetricsAddr, "serving metrics", back}} {
		if l.addr == "" {
			continue
		}
		ln, err := Listen(l.setting, l.addr)
		if err != nil {
			fail(log, name, err)
		}
		log.Info(l.msg, "addr", ln.Addr().String())
		listeners++
		go func() { served <- ServeOn(hctx, ln, l.h, DefaultLimits) }()
	}
	return listeners
}

// startService connects spec's service, builds it and starts it; a failure
// ends the process.
func startService(ctx context.Context, spec Spec, cfg config.Config, log *slog.Logger) (*Env, Part, http.Handler) {
	env, err := Connect(ctx, spec.Name, cfg, log)
	if err != nil {
		fail(log, spec.Name, err)
	}
	part, api, err := spec.Build(env)
	if err == nil {
		err = startRefusable(ctx, env, part)
	}
	if err != nil {
		if v := env.Refusal(); v != "" {
			err = fmt.Errorf("%w (the NATS server refused this credential: %s; is ASSAY_NATS_URL this service's user?)", err, v)
		}
		env.Close(context.Background())
		fail(log, spec.Name, err)
	}
	return env, part, api
}

// startRefusable starts part, and gives up at once when the NATS server
// refuses this credential something while it starts: the service's user
// may make every call a start makes, so a refusal is a wrong credential,
// which no retry of the start mends.
func startRefusable(ctx context.Context, env *Env, part Part) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-env.nats.firstRefusal():
			cancel()
		case <-sctx.Done():
		}
	}()
	return part.Start(sctx)
}

// drain stops taking work, finishes or releases what is held, stops the
// listeners and closes the pools, within drainGrace. It returns err, or
// else the first error a listener ended with.
func drain(log *slog.Logger, env *Env, part Part, stopHTTP context.CancelFunc, served <-chan error, listeners int, err error) error {
	start := time.Now()
	env.draining.Store(true)
	log.Info("draining: no new work; what is held finishes or is released", "grace", drainGrace.String())
	dctx, cancel := context.WithTimeout(context.Background(), drainGrace)
	defer cancel()
	part.Stop(dctx)
	stopHTTP()
	for range listeners {
		if serr := <-served; err == nil {
			err = serr
		}
	}
	env.Close(dctx)
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String(), "clean", dctx.Err() == nil)
	return err
}

// drainGrace bounds the drain; pods need a termination grace above it.
const drainGrace = 25 * time.Second

// swapHandler serves whichever handler was stored last: the starting
// answers until the service is built, then its own.
type swapHandler struct{ h atomic.Pointer[http.Handler] }

func (s *swapHandler) Store(h http.Handler) { s.h.Store(&h) }

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// Starting is what a service's API port answers while it connects.
func Starting() http.Handler { return starting(true) }

// starting answers while a service connects: alive (/healthz, on the API
// port), not ready, nothing else served yet.
func starting(api bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if api && r.Method == http.MethodGet && r.URL.Path == "/healthz" {
			apierror.JSON(w, http.StatusOK, map[string]string{"status": "starting"})
			return
		}
		if api && r.URL.Path == "/readyz" {
			apierror.JSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting"})
			return
		}
		apierror.Write(w, http.StatusServiceUnavailable, "starting", "the service is starting: it waits for Postgres and NATS")
	})
}

func fail(log *slog.Logger, name string, err error) {
	log.Error("failed", "err", err)
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	os.Exit(1)
}

// ownValues are the service's own settings that are set, by name.
func ownValues(vars []config.Var, getenv func(string) string) map[string]string {
	out := map[string]string{}
	for _, v := range vars {
		if val := getenv(v.Name); val != "" {
			out[v.Name] = val
		}
	}
	return out
}

// ownSettings are a service's own settings as it runs with them: each set
// variable's value as config.RedactedSetting shows it (a URL's credentials
// replaced, whatever the variable; one named for a secret only as set),
// the rest as their defaults.
func ownSettings(vars []config.Var, getenv func(string) string) map[string]string {
	out := make(map[string]string, len(vars))
	for _, v := range vars {
		val := getenv(v.Name)
		if val == "" {
			val = "default: " + v.Default
		} else {
			val = config.RedactedSetting(v.Name, val)
		}
		out[v.Name] = val
	}
	return out
}
