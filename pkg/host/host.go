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
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/apierror"
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
}

// Part is a service as the host sees it: a lifecycle part that can say
// whether it is ready.
type Part interface {
	lifecycle.Service
	Ready(ctx context.Context) error
}

// Connect opens everything a service of a cell needs.
func Connect(ctx context.Context, name string, cfg config.Config, log *slog.Logger, opts ...telemetry.Option) (*Env, error) {
	tel, err := telemetry.Setup(ctx, name, cfg.Region, opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	reg, err := contract.Load()
	if err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("ASSAY_DATABASE_URL: %w", err)
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		return nil, err
	}
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("assay-"+name+"-"+cfg.Region),
		nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("ASSAY_NATS_URL: connect %s: %w", config.Redacted(cfg.NATSURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		st.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Env{Config: cfg, Store: st, NC: nc, JS: js, Contracts: reg, Log: log, Tel: tel}, nil
}

// Close releases connections, last to first.
func (e *Env) Close(ctx context.Context) {
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
// /healthz (the process answers), /readyz (every part is ready) and
// /metrics. /readyz answers ready or not ready and nothing more, since
// anyone may ask it; why a part is not ready goes to the log, once each
// time the reason changes.
func Mux(api http.Handler, tel *telemetry.Provider, log *slog.Logger, parts ...Part) *http.ServeMux {
	mux := http.NewServeMux()
	if api != nil {
		mux.Handle("/v1/", api)
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
			log.Warn("not ready", "err", why)
		case changed:
			log.Info("ready")
		}
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		for _, p := range parts {
			if err := p.Ready(ctx); err != nil {
				note(err.Error())
				apierror.JSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
				return
			}
		}
		note("")
		apierror.JSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	if tel != nil {
		mux.Handle("GET /metrics", tel.MetricsHandler())
	}
	return mux
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

// Serve listens on addr and serves h within lim until ctx ends, then shuts
// down. It returns the bound address through bound once listening.
func Serve(ctx context.Context, addr string, h http.Handler, lim Limits, bound func(string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ASSAY_HTTP_ADDR: listen %s: %w", addr, err)
	}
	if bound != nil {
		bound(ln.Addr().String())
	}
	lim = lim.orDefault()
	srv := &http.Server{Handler: http.MaxBytesHandler(h, lim.MaxRequestBytes), ReadHeaderTimeout: lim.ReadHeader,
		ReadTimeout: lim.Read, WriteTimeout: lim.Write, IdleTimeout: lim.Idle}
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

// Main runs one service process. build makes the service from the Env,
// with its own API (may be nil). Exit codes: 2 for a bad setting, 1 for a
// failure.
func Main(name string, need config.Need, build func(*Env) (Part, http.Handler, error)) {
	log := telemetry.NewLogger(os.Stderr, name, os.Getenv("ASSAY_REGION"), slog.LevelInfo)
	cfg, err := config.Load(name, os.Args[1:], os.Getenv, need)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	log = telemetry.NewLogger(os.Stderr, name, cfg.Region, slog.LevelInfo)
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stopSignals()
	env, err := Connect(ctx, name, cfg, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	part, api, err := build(env)
	if err == nil {
		err = part.Start(ctx)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		env.Close(context.Background())
		os.Exit(1)
	}
	err = Serve(ctx, cfg.HTTPAddr, Mux(api, env.Tel, log, part), DefaultLimits, func(a string) {
		log.Info("serving", "addr", a)
	})
	// Stop taking work, finish or release what is held, then close pools.
	dctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	part.Stop(dctx)
	env.Close(dctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
