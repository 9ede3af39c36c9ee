package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
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
	Prices     ledger.Prices
	// NoClassifier leaves the classifier out, for tests that drive
	// classifiers by hand.
	NoClassifier bool
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
	o.Ingress.Region = o.Config.Region
	if c.Ingress, err = ingress.New(o.Ingress, ingress.Deps{Store: env.Store, JS: env.JS, Contracts: env.Contracts,
		Log: env.Log.With("service", "ingress"), Tel: env.Tel}); err != nil {
		return c, err
	}
	o.Classifier.Region, o.Classifier.Model = o.Config.Region, o.Config.Model
	mc := modelClient(o.Config)
	if c.Classifier, err = classifier.New(o.Classifier, classifier.Deps{Store: env.Store, JS: env.JS, Model: mc,
		Contracts: env.Contracts, Log: env.Log.With("service", "classifier"), Tel: env.Tel}); err != nil {
		return c, err
	}
	if c.Committer, err = committer.New(committer.Config{Region: o.Config.Region}, committer.Deps{Store: env.Store,
		JS: env.JS, Contracts: env.Contracts, Log: env.Log.With("service", "committer"), Tel: env.Tel}); err != nil {
		return c, err
	}
	if c.Ledger, err = ledger.New(ledger.Config{Region: o.Config.Region, Prices: o.Prices}, ledger.Deps{Store: env.Store,
		JS: env.JS, Log: env.Log.With("service", "ledger"), Tel: env.Tel}); err != nil {
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
		c.Env.Close(ctx)
	})
}

func modelClient(cfg config.Config) *model.Client {
	return &model.Client{BaseURL: cfg.ModelBaseURL, APIKey: cfg.ModelAPIKey, Model: cfg.Model}
}
