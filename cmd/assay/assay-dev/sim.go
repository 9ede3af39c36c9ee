package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/telemetry"
)

const simUsage = `usage: assay-dev sim [--addr HOST:PORT]

Run the simulated OpenAI-compatible provider (POST /v1/chat/completions,
GET /sim/stats, POST /sim/faults). --addr defaults to $ASSAY_HTTP_ADDR, else
127.0.0.1:8090.
`

// runSim runs `assay-dev sim [--addr HOST:PORT]`: the simulated
// OpenAI-compatible provider, until interrupted.
func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assay-dev sim", flag.ContinueOnError)
	addr := fs.String("addr", cmp.Or(os.Getenv("ASSAY_HTTP_ADDR"), "127.0.0.1:8090"), "listen address ($ASSAY_HTTP_ADDR)")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: err}
	}
	log := telemetry.NewLogger(os.Stderr, "sim", "", slog.LevelInfo)
	s := sim.New(sim.Options{Logger: log})
	url, err := s.Start(*addr)
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("ASSAY_HTTP_ADDR: %w", err)}
	}
	// Logged as the services log it, so a script finds where it listens.
	log.Info("serving", "addr", strings.TrimPrefix(url, "http://"))
	fmt.Printf("simulated provider at %s (base URL %s, GET %s/sim/stats)\n", url, sim.APIBase(url), url)
	<-ctx.Done()
	return s.Close()
}
