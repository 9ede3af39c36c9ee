// Command committer gates and commits one cell's results.
package main

import (
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/services/committer"
)

func main() {
	host.Main("committer", config.Need{HTTPAddr: ":8082"}, func(e *host.Env) (host.Part, http.Handler, error) {
		cfg := committer.Config{Region: e.Config.Region, Names: e.Config.Names()}
		if err := cfg.FromEnv(os.Getenv); err != nil {
			return nil, nil, err
		}
		s, err := committer.New(cfg,
			committer.Deps{Store: e.Store, JS: e.JS, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
		return s, nil, err
	})
}
