// Command classifier calls the model for one cell's work.
package main

import (
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
	"assay.dev/services/classifier"
)

func main() {
	host.Main("classifier", config.Need{Model: true, HTTPAddr: ":8081"}, func(e *host.Env) (host.Part, http.Handler, error) {
		cfg := classifier.Config{Region: e.Config.Region, Names: e.Config.Names(), Streams: e.Config.Streams, Model: e.Config.Model}
		if err := cfg.FromEnv(os.Getenv); err != nil {
			return nil, nil, err
		}
		mc := &model.Client{BaseURL: e.Config.ModelBaseURL, APIKey: e.Config.ModelAPIKey, Model: e.Config.Model}
		s, err := classifier.New(cfg,
			classifier.Deps{Store: e.Store, JS: e.JS, Model: mc, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
		return s, nil, err
	})
}
