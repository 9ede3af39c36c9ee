// Command classifier calls the model for one cell's work.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"assay.dev/pkg/config"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
	"assay.dev/pkg/price"
	"assay.dev/services/classifier"
)

func main() {
	host.Main("classifier", config.Need{Model: true, HTTPAddr: ":8081"}, func(e *host.Env) (host.Part, http.Handler, func(context.Context), error) {
		prices, err := price.Load(os.Getenv("ASSAY_PRICE_TABLE"))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("ASSAY_PRICE_TABLE: %w", err)
		}
		mc := &model.Client{BaseURL: e.Config.ModelBaseURL, APIKey: e.Config.ModelAPIKey, Model: e.Config.Model}
		s, err := classifier.New(classifier.Config{Region: e.Config.Region, Model: e.Config.Model, Prices: prices},
			classifier.Deps{Store: e.Store, JS: e.JS, Model: mc, Contracts: e.Contracts, Log: e.Log, Tel: e.Tel})
		if err != nil {
			return nil, nil, nil, err
		}
		return s, nil, s.Stop, nil
	})
}
