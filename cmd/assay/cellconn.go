package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// operatorEnv reads what an operator command takes from the environment
// besides its own flags: the installation's regions and names, and the
// cell's NATS.
func operatorEnv(k string) string {
	switch k {
	case "ASSAY_REGIONS", "ASSAY_INSTALLATION", "ASSAY_CELL", "ASSAY_NATS_URL":
		return os.Getenv(k)
	}
	return ""
}

// loadCell checks the cell settings of an operator command: --region and
// --database-url (the latter may be "" for commands that only read NATS).
func loadCell(name, region, dbURL string) (config.Config, error) {
	if dbURL == "" {
		return natsOnlyCell(region)
	}
	cfg, err := config.Load(name, []string{"--region", region, "--database-url", dbURL}, operatorEnv, config.Need{})
	if err != nil {
		return cfg, cli.ConfigError{Err: err}
	}
	return cfg, nil
}

// natsOnlyCell is the cell of a command that reads only NATS.
func natsOnlyCell(region string) (config.Config, error) {
	regions, err := config.ParseRegions(envOr("ASSAY_REGIONS", strings.Join(config.DefaultRegions, ",")))
	if err != nil {
		return config.Config{}, cli.ConfigError{Err: fmt.Errorf("ASSAY_REGIONS: %w", err)}
	}
	if region == "" {
		return config.Config{}, cli.ConfigError{Err: config.Missing("ASSAY_REGION")}
	}
	if err := config.ValidateRegion(regions, region); err != nil {
		return config.Config{}, cli.ConfigError{Err: fmt.Errorf("ASSAY_REGION (--region): %w", err)}
	}
	cfg := config.Config{Regions: regions, Region: region, Cell: envOr("ASSAY_CELL", region),
		Installation: envOr("ASSAY_INSTALLATION", event.DefaultInstallation), NATSURL: envOr("ASSAY_NATS_URL", "nats://127.0.0.1:4222")}
	if err := cfg.Names().Check(); err != nil {
		return cfg, cli.ConfigError{Err: err}
	}
	return cfg, nil
}

// openStore opens the cell's Postgres.
func openStore(ctx context.Context, url string) (*store.Store, error) {
	if url == "" {
		return nil, cli.ConfigError{Err: config.Missing("ASSAY_DATABASE_URL")}
	}
	st, err := store.Open(ctx, url)
	if store.SQLState(err) == "3D000" {
		return nil, fmt.Errorf("ASSAY_DATABASE_URL: %w (create it and its tables with: assay migrate --create-database)", config.RedactError(err, url))
	}
	if err != nil {
		return nil, fmt.Errorf("ASSAY_DATABASE_URL: %w", config.RedactError(err, url))
	}
	return st, nil
}

// connectNATS connects to the cell's NATS as an operator tool; close the
// connection when done.
func connectNATS(cfg config.Config) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("assay-operator-"+cfg.Region), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("ASSAY_NATS_URL %s: %w", config.Redacted(cfg.NATSURL), config.RedactError(err, cfg.NATSURL))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("ASSAY_NATS_URL %s: %w", config.Redacted(cfg.NATSURL), config.RedactError(err, cfg.NATSURL))
	}
	return nc, js, nil
}

// parseArgs parses fs's flags wherever they stand among the positional
// arguments and returns those.
func parseArgs(fs interface {
	Parse([]string) error
	Args() []string
}, args []string, usage string) ([]string, error) {
	var pos []string
	for rest := args; len(rest) > 0; {
		if err := fs.Parse(rest); err != nil {
			return nil, cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, usage)}
		}
		if rest = fs.Args(); len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	return pos, nil
}
