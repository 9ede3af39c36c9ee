// Command ingress serves one cell's ingress API.
package main

import (
	"net/http"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/ingress"
)

func main() {
	var cfg ingress.Config
	host.Run(host.Spec{
		Name: "ingress", Doc: "ingress serves one cell's API: work, GitHub webhooks, usage and the console; it owns the WORK stream.",
		Need: config.Need{HTTPAddr: "127.0.0.1:8080", MetricsAddr: "127.0.0.1:9090"}, Vars: ingress.Vars, Configure: cfg.FromEnv,
		Build: func(e *host.Env) (host.Part, http.Handler, error) {
			cfg.Region, cfg.Names, cfg.Streams = e.Config.Region, e.Config.Names(), e.Config.Streams
			s, err := ingress.New(cfg, ingress.Deps{Store: e.Store, JS: e.JS, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
			if err != nil {
				return nil, nil, err
			}
			return s, s.Handler(), nil
		},
	})
}
