// Command ledger records one cell's attempts and answers usage queries.
package main

import (
	"net/http"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/ledger"
)

func main() {
	var cfg ledger.Config
	host.Run(host.Spec{
		Name: "ledger", Doc: "ledger records every attempt once, settles budgets and answers usage queries.",
		Need: config.Need{HTTPAddr: "127.0.0.1:8083", MetricsAddr: "127.0.0.1:9093"}, Vars: ledger.Vars, Configure: cfg.FromEnv,
		Build: func(e *host.Env) (host.Part, http.Handler, error) {
			cfg.Region, cfg.Names = e.Config.Region, e.Config.Names()
			s, err := ledger.New(cfg, ledger.Deps{Store: e.Store, JS: e.JS, Log: e.Log, Tel: e.Tel})
			if err != nil {
				return nil, nil, err
			}
			return s, s.Handler(), nil
		},
	})
}
