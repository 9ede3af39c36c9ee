// Package cell wires one region's four services into one process, and
// runs the all-in-one dev mode around such cells: in-process NATS, a
// throwaway Postgres, the simulated provider. The CLI's dev mode and demo,
// the benchmarks and the end-to-end tests all start cells here.
package cell

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/model"
	"assay.dev/pkg/price"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
	"assay.dev/services/ledger"
)

// Options configure one cell run in-process.
type Options struct {
	Config     config.Config
	Log        *slog.Logger
	Classifier classifier.Config // Region, Names, Streams and Model are filled in
	Ingress    ingress.Config    // Region, Names and Streams are filled in
	Committer  committer.Config  // Region, Names and Streams are filled in
	Ledger     ledger.Config     // Region, Names and Prices are filled in
	Prices     price.Prices
	// NoClassifier leaves the classifier out, for tests that drive
	// classifiers by hand.
	NoClassifier bool
	// WrapModel, when set, wraps the model client the classifier calls
	// (the goodput benchmark's baseline retries naively inside it).
	WrapModel func(classifier.Completer) classifier.Completer
	// NATSURLs, when set, gives each service ("ingress", "classifier",
	// "committer", "ledger") a connection of its own from this URL, so each
	// works with its own credentials alone. Nil shares Env's connection.
	NATSURLs map[string]string
	// Telemetry adjusts the cell's telemetry (a test reads its spans).
	Telemetry []telemetry.Option
	// HTTP bounds what a client can hold of the cell's listener; zero
	// fields take host.DefaultLimits.
	HTTP host.Limits
	// StoreTracer, when set, gives the named service's pool a tracer that
	// sees every statement it sends (the pipeline benchmark counts them).
	StoreTracer func(service string) pgx.QueryTracer
	// WrapHTTP, when set, wraps the cell's whole HTTP surface, its metrics
	// listener's too (the tests hold every answer to the API's description
	// with it).
	WrapHTTP func(http.Handler) http.Handler
	// RegisterURL registers the cell's listener in its region's placement
	// map as where it answers, once it listens, so the region's other cells
	// send the requests of the tenants placed on it there.
	RegisterURL bool
}

// Cell is one region's four services in one process, behind one HTTP
// listener that serves the ingress API, the usage API and health, and a
// listener of its own for metrics, never on the API's.
type Cell struct {
	Region string
	URL    string
	// MetricsURL is the base URL of the metrics listener (Config.MetricsAddr,
	// default a free port on 127.0.0.1): its /metrics names tenants and
	// their outcomes, which the API's port never shows.
	MetricsURL string
	Env        *host.Env
	Ingress    *ingress.Service
	Classifier *classifier.Service
	Committer  *committer.Service
	Ledger     *ledger.Service

	parts     []host.Part  // started, in start order
	conns     []*nats.Conn // per-service connections, from NATSURLs
	stores    []*store.Store
	stopHTTP  context.CancelFunc
	httpDone  chan error
	listeners int // how many servers send on httpDone when they end
	stopOnce  sync.Once
}

// Start connects, builds and starts the cell's services and serves its
// HTTP surface on Config.HTTPAddr and its metrics on Config.MetricsAddr
// (each by default a free port on 127.0.0.1).
func Start(ctx context.Context, o Options) (c *Cell, err error) {
	env, err := host.Connect(ctx, "dev", o.Config, o.Log, o.Telemetry...)
	if err != nil {
		return nil, err
	}
	c = &Cell{Region: o.Config.Region, Env: env}
	defer func() {
		if err != nil {
			c.Stop(context.Background())
		}
	}()
	js := map[string]jetstream.JetStream{}
	db := map[string]*store.Store{}
	for _, name := range []string{"ingress", "classifier", "committer", "ledger"} {
		if js[name], err = c.serviceJS(o, name); err != nil {
			return c, err
		}
		if db[name], err = c.serviceStore(ctx, o, name); err != nil {
			return c, err
		}
	}
	cfg, names := o.Config, o.Config.Names()
	log := func(service string) *slog.Logger { return env.Log.With("service", service) }
	o.Ingress.Region, o.Ingress.Names, o.Ingress.Streams = cfg.Region, names, cfg.Streams
	if c.Ingress, err = ingress.New(o.Ingress, ingress.Deps{Store: db["ingress"], JS: js["ingress"], Contracts: env.Contracts,
		Log: log("ingress"), Tel: env.Tel}); err != nil {
		return c, err
	}
	o.Classifier.Region, o.Classifier.Names, o.Classifier.Streams, o.Classifier.Model = cfg.Region, names, cfg.Streams, cfg.Model
	if o.Classifier.Prices == nil {
		o.Classifier.Prices = o.Prices
	}
	var mc classifier.Completer = ModelClient(cfg)
	if o.WrapModel != nil {
		mc = o.WrapModel(mc)
	}
	if c.Classifier, err = classifier.New(o.Classifier, classifier.Deps{Store: db["classifier"], JS: js["classifier"], Model: mc,
		Contracts: env.Contracts, Log: log("classifier"), Tel: env.Tel}); err != nil {
		return c, err
	}
	o.Committer.Region, o.Committer.Names, o.Committer.Streams = cfg.Region, names, cfg.Streams
	if c.Committer, err = committer.New(o.Committer, committer.Deps{Store: db["committer"],
		JS: js["committer"], Contracts: env.Contracts, Log: log("committer"), Tel: env.Tel}); err != nil {
		return c, err
	}
	o.Ledger.Region, o.Ledger.Names, o.Ledger.Prices = cfg.Region, names, o.Prices
	if c.Ledger, err = ledger.New(o.Ledger, ledger.Deps{Store: db["ledger"],
		JS: js["ledger"], Log: log("ledger"), Tel: env.Tel}); err != nil {
		return c, err
	}
	// Each stream's owner first: ingress creates WORK, the classifier
	// RESULT and ATTEMPT; the consumers wait for their streams anyway.
	parts := []host.Part{c.Ingress, c.Classifier, c.Committer, c.Ledger}
	if o.NoClassifier {
		parts = []host.Part{c.Ingress, c.Committer, c.Ledger}
	}
	for _, p := range parts {
		if err = p.Start(ctx); err != nil {
			return c, err
		}
		c.parts = append(c.parts, p)
	}
	if err = c.serve(ctx, o.Config, o.HTTP, o.WrapHTTP, parts); err != nil || !o.RegisterURL {
		return c, err
	}
	return c, c.Ingress.RegisterCell(ctx, c.URL)
}

// serve serves the cell's HTTP surface on cfg.HTTPAddr: the ingress and
// usage APIs, health and readiness of every part; and its metrics on
// cfg.MetricsAddr, a listener of their own.
func (c *Cell) serve(ctx context.Context, cfg config.Config, lim host.Limits, wrap func(http.Handler) http.Handler, parts []host.Part) error {
	api := http.NewServeMux()
	api.Handle("/v1/work", c.Ingress.Handler())
	api.Handle("/v1/work/", c.Ingress.Handler())
	api.Handle("/v1/webhooks/", c.Ingress.Handler())
	api.Handle("/v1/batches", c.Ingress.Handler())
	api.Handle("/v1/batches/", c.Ingress.Handler())
	api.Handle("/v1/reviews", c.Ingress.Handler())
	api.Handle("/v1/reviews/", c.Ingress.Handler())
	api.Handle("/v1/views", c.Ingress.Handler())
	api.Handle("/v1/openapi.yaml", c.Ingress.Handler())
	api.Handle("/v1/usage", c.Ingress.Handler())
	api.Handle("/console", c.Ingress.Handler())
	api.Handle("/console/", c.Ingress.Handler())
	api.Handle("/v1/console", c.Ingress.Handler())
	api.Handle("/v1/console/", c.Ingress.Handler())
	mux, metrics := host.Mux(api, c.Env, parts...), host.MetricsMux(c.Env)
	if wrap != nil {
		mux, metrics = wrap(mux), wrap(metrics)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.stopHTTP, c.httpDone = cancel, make(chan error, 2)
	var err error
	if c.URL, err = c.listen(hctx, cfg.HTTPAddr, mux, lim); err != nil {
		return err
	}
	c.MetricsURL, err = c.listen(hctx, cfg.MetricsAddr, metrics, lim)
	return err
}

// listen serves h on addr ("": a free port on 127.0.0.1) until ctx ends,
// its end sent on httpDone, and returns its base URL once it listens.
func (c *Cell) listen(ctx context.Context, addr string, h http.Handler, lim host.Limits) (string, error) {
	bound := make(chan string, 1)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	c.listeners++
	go func() { c.httpDone <- host.Serve(ctx, addr, h, lim, func(a string) { bound <- a }) }()
	select {
	case a := <-bound:
		return "http://" + a, nil
	case err := <-c.httpDone:
		c.httpDone <- err
		return "", err
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("cell %s: HTTP listener on %s did not start", c.Region, addr)
	}
}

// Stop drains the cell in order: no new requests, no new work taken,
// in-flight attempts finished or released, outboxes flushed, then
// connections closed. Idempotent.
func (c *Cell) Stop(ctx context.Context) {
	c.stopOnce.Do(func() {
		if c.stopHTTP != nil {
			c.stopHTTP()
			for range c.listeners {
				<-c.httpDone
			}
		}
		parts := make([]lifecycle.Service, len(c.parts))
		for i, p := range c.parts {
			parts[i] = p
		}
		lifecycle.StopAll(ctx, parts...)
		for _, nc := range c.conns {
			_ = nc.Drain()
		}
		for _, st := range c.stores {
			st.Close()
		}
		c.Env.Close(ctx)
	})
}

// serviceJS is the JetStream a service uses: Env's, or with NATSURLs one on
// a connection of the service's own.
func (c *Cell) serviceJS(o Options, name string) (jetstream.JetStream, error) {
	if o.NATSURLs == nil {
		return c.Env.JS, nil
	}
	u, ok := o.NATSURLs[name]
	if !ok {
		return nil, fmt.Errorf("cell %s: no NATS URL for %s", c.Region, name)
	}
	log := c.Env.Log.With("service", name)
	// Permission violations are asynchronous; without this they are silent.
	nc, err := nats.Connect(u, nats.Name("assay-"+name+"-"+c.Region),
		nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("nats", "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("cell %s: NATS for %s: %w", c.Region, name, err)
	}
	c.conns = append(c.conns, nc)
	return jetstream.New(nc)
}

// serviceStore is a pool of the service's own, as each service has when it
// runs as its own process: ASSAY_DATABASE_POOL sizes each, not the four
// together.
func (c *Cell) serviceStore(ctx context.Context, o Options, name string) (*store.Store, error) {
	so := store.Options{MaxConns: o.Config.DatabasePool}
	if o.StoreTracer != nil {
		so.Tracer = o.StoreTracer(name)
	}
	st, err := store.Open(ctx, o.Config.DatabaseURL, so)
	if err != nil {
		return nil, fmt.Errorf("cell %s: database for %s: %w", c.Region, name, err)
	}
	c.stores = append(c.stores, st)
	return st, nil
}

// ModelClient is the model adapter a cell's classifier calls.
func ModelClient(cfg config.Config) *model.Client {
	return &model.Client{BaseURL: cfg.ModelBaseURL, Endpoint: cfg.ModelEndpoint, APIKey: cfg.ModelAPIKey, Model: cfg.Model}
}
