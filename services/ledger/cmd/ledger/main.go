// Command ledger records one cell's attempts and answers usage queries.
package main

import (
	"fmt"
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/price"
	"assay.dev/services/ledger"
)

func main() {
	host.Main("ledger", config.Need{HTTPAddr: ":8083"}, func(e *host.Env) (host.Part, http.Handler, error) {
		prices, err := price.Load(os.Getenv("ASSAY_PRICE_TABLE"))
		if err != nil {
			return nil, nil, fmt.Errorf("ASSAY_PRICE_TABLE: %w", err)
		}
		cfg := ledger.Config{Region: e.Config.Region, Names: e.Config.Names(), Prices: prices}
		if err := cfg.FromEnv(os.Getenv); err != nil {
			return nil, nil, err
		}
		s, err := ledger.New(cfg, ledger.Deps{Store: e.Store, JS: e.JS, Log: e.Log, Tel: e.Tel})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Handler(), nil
	})
}
