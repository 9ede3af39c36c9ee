// Command ingress serves one cell's ingress API.
package main

import (
	"context"
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/ingress"
)

func main() {
	host.Main("ingress", config.Need{HTTPAddr: ":8080"}, func(e *host.Env) (host.Part, http.Handler, func(context.Context), error) {
		cfg := ingress.Config{Region: e.Config.Region}
		if err := cfg.FromEnv(os.Getenv); err != nil {
			return nil, nil, nil, err
		}
		s, err := ingress.New(cfg, ingress.Deps{Store: e.Store, JS: e.JS, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
		if err != nil {
			return nil, nil, nil, err
		}
		return s, s.Handler(), func(context.Context) { s.Stop() }, nil
	})
}
