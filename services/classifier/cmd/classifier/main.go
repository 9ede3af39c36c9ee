// Command classifier calls the model for one cell's work.
package main

import (
	"net/http"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
	"assay.dev/services/classifier"
)

func main() {
	var cfg classifier.Config
	host.Run(host.Spec{
		Name: "classifier", Doc: "classifier claims one cell's work, calls the model and gates the answer; it owns the RESULT and ATTEMPT streams.",
		Need: config.Need{Model: true, HTTPAddr: "127.0.0.1:8081", MetricsAddr: "127.0.0.1:9091"}, Vars: classifier.Vars, Configure: cfg.FromEnv,
		Build: func(e *host.Env) (host.Part, http.Handler, error) {
			cfg.Region, cfg.Names, cfg.Streams, cfg.Model = e.Config.Region, e.Config.Names(), e.Config.Streams, e.Config.Model
			mc := &model.Client{BaseURL: e.Config.ModelBaseURL, Endpoint: e.Config.ModelEndpoint, APIKey: e.Config.ModelAPIKey, Model: e.Config.Model}
			s, err := classifier.New(cfg,
				classifier.Deps{Store: e.Store, JS: e.JS, Model: mc, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
			return s, nil, err
		},
	})
}
