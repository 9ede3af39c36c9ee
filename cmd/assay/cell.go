package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
	"assay.dev/pkg/price"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
	"assay.dev/services/ledger"
)

// cellOptions configure one cell run in-process.
type cellOptions struct {
	Config     config.Config
	Log        *slog.Logger
	Classifier classifier.Config // Region and Model are filled in
	Ingress    ingress.Config    // Region is filled in
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
}

// cell is one region's four services in one process, behind one HTTP
// listener that serves the ingress API, the usage API, health and metrics.
type cell struct {
	Region     string
	URL        string
	Env        *host.Env
	Ingress    *ingress.Service
	Classifier *classifier.Service
	Committer  *committer.Service
	Ledger     *ledger.Service

	noClassifier bool
	conns        []*nats.Conn // per-service connections, from NATSURLs
	stopHTTP     context.CancelFunc
	httpDone     chan error
	stopOnce     sync.Once
}

func startCell(ctx context.Context, o cellOptions) (c *cell, err error) {
	env, err := host.Connect(ctx, "dev", o.Config, o.Log)
	if err != nil {
		return nil, err
	}
	c = &cell{Region: o.Config.Region, Env: env, noClassifier: o.NoClassifier}
	defer func() {
		if err != nil {
			c.Stop(context.Background())
		}
	}()
	js := map[string]jetstream.JetStream{}
	for _, name := range []string{"ingress", "classifier", "committer", "ledger"} {
		if js[name], err = c.serviceJS(o, name); err != nil {
			return c, err
		}
	}
	o.Ingress.Region = o.Config.Region
	if c.Ingress, err = ingress.New(o.Ingress, ingress.Deps{Store: env.Store, JS: js["ingress"], Contracts: env.Contracts,
		Log: env.Log.With("service", "ingress"), Tel: env.Tel}); err != nil {
		return c, err
	}
	o.Classifier.Region, o.Classifier.Model = o.Config.Region, o.Config.Model
	if o.Classifier.Prices == nil {
		o.Classifier.Prices = o.Prices
	}
	var mc classifier.Completer = modelClient(o.Config)
	if o.WrapModel != nil {
		mc = o.WrapModel(mc)
	}
	if c.Classifier, err = classifier.New(o.Classifier, classifier.Deps{Store: env.Store, JS: js["classifier"], Model: mc,
		Contracts: env.Contracts, Log: env.Log.With("service", "classifier"), Tel: env.Tel}); err != nil {
		return c, err
	}
	if c.Committer, err = committer.New(committer.Config{Region: o.Config.Region}, committer.Deps{Store: env.Store,
		JS: js["committer"], Contracts: env.Contracts, Log: env.Log.With("service", "committer"), Tel: env.Tel}); err != nil {
		return c, err
	}
	if c.Ledger, err = ledger.New(ledger.Config{Region: o.Config.Region, Prices: o.Prices}, ledger.Deps{Store: env.Store,
		JS: js["ledger"], Log: env.Log.With("service", "ledger"), Tel: env.Tel}); err != nil {
		return c, err
	}
	parts := []host.Part{c.Ingress, c.Ledger, c.Committer, c.Classifier}
	if o.NoClassifier {
		parts = parts[:3]
	}
	for _, p := range parts {
		if err = p.Start(ctx); err != nil {
			return c, err
		}
	}
	api := http.NewServeMux()
	api.Handle("/v1/work", c.Ingress.Handler())
	api.Handle("/v1/work/", c.Ingress.Handler())
	api.Handle("/v1/webhooks/", c.Ingress.Handler())
	api.Handle("/v1/usage", c.Ledger.Handler())
	mux := host.Mux(api, env.Tel, parts...)
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.stopHTTP, c.httpDone = cancel, make(chan error, 1)
	bound := make(chan string, 1)
	addr := o.Config.HTTPAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	go func() { c.httpDone <- host.Serve(hctx, addr, mux, func(a string) { bound <- a }) }()
	select {
	case a := <-bound:
		c.URL = "http://" + a
	case err = <-c.httpDone:
		c.httpDone <- err
		return c, err
	case <-time.After(10 * time.Second):
		return c, fmt.Errorf("cell %s: HTTP listener did not start", c.Region)
	}
	return c, nil
}

// Stop drains the cell in order: no new requests, no new work taken,
// in-flight attempts finished or released, outboxes flushed, then
// connections closed. Idempotent.
func (c *cell) Stop(ctx context.Context) {
	c.stopOnce.Do(func() {
		if c.stopHTTP != nil {
			c.stopHTTP()
			<-c.httpDone
		}
		if c.Ingress != nil {
			c.Ingress.Stop()
		}
		if c.Classifier != nil && !c.noClassifier {
			c.Classifier.Stop(ctx)
		}
		if c.Committer != nil {
			c.Committer.Stop(ctx)
		}
		if c.Ledger != nil {
			c.Ledger.Stop(ctx)
		}
		for _, nc := range c.conns {
			_ = nc.Drain()
		}
		c.Env.Close(ctx)
	})
}

// serviceJS is the JetStream a service uses: Env's, or with NATSURLs one on
// a connection of the service's own.
func (c *cell) serviceJS(o cellOptions, name string) (jetstream.JetStream, error) {
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

func modelClient(cfg config.Config) *model.Client {
	return &model.Client{BaseURL: cfg.ModelBaseURL, APIKey: cfg.ModelAPIKey, Model: cfg.Model}
}
