// Command ingress serves one cell's ingress API.
package main

import (
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/ingress"
)

func main() {
	host.Main("ingress", config.Need{HTTPAddr: ":8080"}, func(e *host.Env) (host.Part, http.Handler, error) {
		cfg := ingress.Config{Region: e.Config.Region, Names: e.Config.Names(), Streams: e.Config.Streams}
		if err := cfg.FromEnv(os.Getenv); err != nil {
			return nil, nil, err
		}
		s, err := ingress.New(cfg, ingress.Deps{Store: e.Store, JS: e.JS, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Handler(), nil
	})
}
