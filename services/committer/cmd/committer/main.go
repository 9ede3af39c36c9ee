// Command committer gates and commits one cell's results.
package main

import (
	"net/http"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/committer"
)

func main() {
	var cfg committer.Config
	host.Run(host.Spec{
		Name: "committer", Doc: "committer checks each answer again and commits one result per work item.",
		Need: config.Need{HTTPAddr: "127.0.0.1:8082", MetricsAddr: "127.0.0.1:9092"}, Vars: committer.Vars, Configure: cfg.FromEnv,
		Build: func(e *host.Env) (host.Part, http.Handler, error) {
			cfg.Region, cfg.Names, cfg.Streams = e.Config.Region, e.Config.Names(), e.Config.Streams
			s, err := committer.New(cfg,
				committer.Deps{Store: e.Store, JS: e.JS, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
			return s, nil, err
		},
	})
}
