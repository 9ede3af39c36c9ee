// Command assay-dev runs the development commands: the cells of every
// region in one process, on an embedded nats-server, a throwaway Postgres
// (or ASSAY_DATABASE_URL's server) and the simulated provider, for the
// demo, make serve and the benchmarks. It links the four services; assay,
// the operator's tool (cmd/assay), links none of them and has none of these
// commands. make build builds it as bin/assay-dev.
//
//	assay-dev dev [--serve]     both cells in one process, the demo by default
//	assay-dev dev webhook       a signed GitHub delivery to the cells make serve runs
//	assay-dev sim               the simulated provider alone
//	assay-dev bench goodput     the admission benchmark
//	assay-dev bench pipeline    N items through ingress to accepted and ledgered, beside the River build
//	assay-dev bench parts       reviews in parts: parts, calls, cost and time per work
//	assay-dev bench cells       a region of several cells: placement, a move under load, writes per cell
//	assay-dev bench move        a tenant moved between two cells and back under load: refusals, loss, duplicates, latency
package main

import (
	"context"
	"io"
	"os"

	"assay.dev/cmd/assay/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

const mainUsage = `usage: assay-dev <command> [flags]

The development commands: the cells run in this process, on an embedded
nats-server, a throwaway Postgres and the simulated provider. The operator's
commands are in assay (bin/assay).

commands:
  dev [--serve]          run both cells (us, eu) in one process on embedded defaults;
                         without --serve, submit the evaluation set, print results, exit
                         (make demo; make serve runs dev --serve)
  dev webhook            send make serve's cells a signed pull_request delivery of its fake GitHub
  sim                    run the simulated OpenAI-compatible provider (ASSAY_HTTP_ADDR)
  bench goodput          admission benchmark against the simulated provider (make bench-goodput)
  bench pipeline         N items through ingress to accepted and ledgered, beside the River build (make bench)
  bench parts [FILE...]  the evaluation set and each diff FILE reviewed, in parts when large: parts, calls, cost, time
  bench cells            a region of several cells in this process: tenants placed, a move under load, each cell's writes
  bench move             a tenant moved between two cells and back under load: refusals, work lost or duplicated, latency

assay-dev COMMAND --help shows a command's flags. A bad setting or a refusal exits 2, a failure 1.
`

const devUsage = `usage: assay-dev dev [--serve [--port N] [--fresh]] [-v]

Both cells (us, eu) in one process: an embedded nats-server, a throwaway
Postgres (or ASSAY_DATABASE_URL's server) and the simulated provider (or
ASSAY_MODEL_BASE_URL or ASSAY_MODEL_ENDPOINT, with ASSAY_MODEL). Without
--serve it submits the evaluation set, prints each item's outcome and exits;
it exits 1 when no item could reach the model, naming why.
  --serve   keep the cells running with their HTTP API until interrupted,
            and print each cell's endpoints, the tokens and an export line
            for CELL and TOKEN; the decision log goes to a file it names
  --port N  --serve: the us cell listens on 127.0.0.1:N (default 18080), the
            next cells on the next ports; a port that is taken gets a free one
  --fresh   --serve: new tokens; otherwise the tenants', the operator's and
            the webhook secret are kept in the user's cache directory
            (assay/dev-serve.json) and every run answers the same ones
  -v        print the services' decision log to stderr
`

// tool is assay-dev's commands.
var tool = &cli.Tool{
	Name:  "assay-dev",
	Usage: mainUsage,
	Helps: map[string]string{
		"dev":   devUsage + "\n" + devServeUsage + "\n" + devWebhookUsage,
		"sim":   simUsage,
		"bench": benchUsage + "\n" + benchPipeUsage + "\n" + benchPartsUsage + "\n" + benchCellsUsage + "\n" + benchMoveUsage,
	},
	Subcommands: map[string][]string{
		"bench": {"goodput", "pipeline", "parts", "cells", "move"},
	},
}

func run(args []string, stderr io.Writer) int {
	return tool.Main(args, stderr, func(ctx context.Context, name string, args []string) error {
		return devCommand(ctx, name, args, os.Stdout)
	})
}

// devCommand runs dev (the demo, --serve), dev webhook or a bench.
func devCommand(ctx context.Context, name string, args []string, stdout io.Writer) error {
	if name == "bench" {
		return benchCmd(ctx, args, stdout)
	}
	if name == "sim" {
		return runSim(ctx, args)
	}
	if len(args) > 0 && args[0] == "webhook" {
		return devWebhook(ctx, args[1:], stdout)
	}
	return dev(ctx, args, stdout)
}
