//go:build !operator

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/telemetry"
)

func init() {
	helps["bench"] = benchUsage + "\n" + benchPipeUsage + "\n" + benchPartsUsage + "\n" + benchCellsUsage + "\n" + benchMoveUsage
	helps["dev"] += "\n" + devServeUsage + "\n" + devWebhookUsage
}

// devCommand runs a command of the development build: both cells in one
// process (dev), the simulated provider (sim) and the benchmarks (bench).
// They link the dev kit and an embedded nats-server; the operator image's
// assay is built with -tags operator and has none of them.
func devCommand(ctx context.Context, name string, args []string, stdout io.Writer) error {
	switch name {
	case "dev":
		if len(args) > 0 && args[0] == "webhook" {
			return devWebhook(ctx, args[1:], stdout)
		}
		return dev(ctx, args, stdout)
	case "sim":
		return runSim(ctx, args)
	default:
		return benchCmd(ctx, args, stdout)
	}
}

func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assay sim", flag.ContinueOnError)
	addr := fs.String("addr", envOr("ASSAY_HTTP_ADDR", "127.0.0.1:8090"), "listen address ($ASSAY_HTTP_ADDR)")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	log := telemetry.NewLogger(os.Stderr, "sim", "", slog.LevelInfo)
	s := sim.New(sim.Options{Logger: log})
	url, err := s.Start(*addr)
	if err != nil {
		return configError{fmt.Errorf("ASSAY_HTTP_ADDR: %w", err)}
	}
	// Logged as the services log it, so a script finds where it listens.
	log.Info("serving", "addr", strings.TrimPrefix(url, "http://"))
	fmt.Printf("simulated provider at %s (base URL %s, GET %s/sim/stats)\n", url, sim.APIBase(url), url)
	<-ctx.Done()
	return s.Close()
}
