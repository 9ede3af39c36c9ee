// Command assay is the operator's tool. It links none of the services:
// the development commands, which run the cells in one process (the demo,
// make serve, the benchmarks), are in assay-dev (./assay-dev).
//
//	assay migrate             apply the cell's migrations
//	assay tenants seed FILE   create tenants and tokens from a JSON file
//	assay tenant …            add, list, rotate-token, suspend, resume, set-budget, link
//	assay operator token …    create, list, revoke the console's operator tokens
//	assay work rerun ID       queue dropped work again
//	assay work show|list      one work item's whole story; work by filter
//	assay replay …            dump, revalidate or redrive the retained streams
//	assay streams             the cell's streams and consumers
//	assay publish …           failed publications: list, retry, abandon
//	assay rollout …           contract versions: check, set-live, set-candidate, promote, status, compare
//	assay usage reconcile     check attempts against results, the ledger and the provider
//	assay usage show          a tenant's calls, units and cost from the ledger
//	assay usage export        the ledger as CloudEvents 1.0, resumable with a cursor
//	assay version             the build's version
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/cmd/assay/internal/natsconf"
	"assay.dev/pkg/buildinfo"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

const mainUsage = `usage: assay <command> [flags]

commands:
  migrate                apply the cell's migrations (ASSAY_DATABASE_URL)
  tenants seed FILE      create many tenants and tokens from FILE: [{"id","homeRegion","token"}]
  tenant COMMAND         one tenant in this cell: add, list, rotate-token, suspend, resume,
                         set-budget, set-rate, set-weight, link, webhook-secret, callback,
                         check-policy, cost-cap; in the region's placement map: place,
                         placement, move (assay tenant --help)
  operator token COMMAND create, list, revoke the operator tokens that read the console (assay operator for help)
  work rerun ID          queue work that admission dropped again
  work rest ID           review the rest of a partial review under its own --cost-cap
  work show ID           the whole story of one work item: row, attempts, ledger, decisions, messages
  work list              work by state, tenant, lane and time
  replay MODE            the retained streams: dump (JSON lines), revalidate (today's gate on
                         the answers, writes nothing), redrive (failed work again, dry run first)
  streams                the cell's streams and consumers: pending, ack pending, redelivered
  usage reconcile        check attempts against results, the ledger and the provider's counts
  usage show             a tenant's calls, units (cached, reasoning) and cost from the ledger
  usage export           the ledger as CloudEvents 1.0 (OpenMeter), resumable with a cursor
  outbox list|retry      outbox rows set aside because they could not be published; put them back
  publish COMMAND        list, retry (send again, once) or abandon publications that failed past their deadline
  rollout COMMAND        contract versions side by side: check a candidate on the evaluation set, run it in
                         the shadow of live work, promote it (assay rollout --help)
  nats-config            print the least-privilege NATS server configuration (deploy/nats/assay.conf);
                         --passwords FILE [--service-urls FILE] also draw a password per user
  version                print the build's version

assay COMMAND --help shows a command's flags. A bad setting or a refusal exits 2, a failure 1.

The development commands, dev (the demo, make serve) and bench, are in assay-dev
(bin/assay-dev, which make build builds): make demo, make serve, make bench-goodput.
`

// helps are each command's own help, printed for -h or --help.
var helps = map[string]string{
	"migrate": `usage: assay migrate [--create-database] [--region R --database-url URL]

Apply the cell's migrations. --create-database first creates the database
ASSAY_DATABASE_URL names when it is missing and the role may (the services
do the same at start-up).
`,
	"tenants": `usage: assay tenants seed FILE [--region R --database-url URL]

Create the tenants in FILE, a JSON array of {"id","homeRegion","token"},
with their tokens (24 to 256 letters, digits and _.~-); tenants that exist
are left as they are. One tenant at a time, and everything else about
tenants, is assay tenant (assay tenant --help).
`,
	"tenant":   tenantUsage,
	"operator": operatorUsage,
	"work":     workUsage,
	"replay":   replayUsage,
	"streams":  streamsUsage,
	"usage":    usageUsage,
	"outbox": `usage: assay outbox list [--json] | assay outbox retry ID|--all [--region R --database-url URL]

Outbox rows set aside because they could not be published, and putting them back.
`,
	"nats-config": `usage: assay nats-config [--installation NAME] [--cells us,eu] [--passwords FILE [--service-urls FILE] [--server-url URL]]

Print the least-privilege NATS server configuration (deploy/nats/assay.conf):
an account per cell and an account per region for its placement map. A cell
is a region's name, or cell:region for another cell of a region (us-2:us).
--passwords writes a fresh password per user (mode 0600, never over a file
that exists) for the server's environment; --service-urls each service's
ASSAY_NATS_URL with its password, at --server-url (nats://127.0.0.1:4222),
and each cell's ASSAY_PLACEMENT_NATS_URL for its ingress and its operator.
`,
	"publish": publishUsage,
	"rollout": rolloutUsage,
	"version": "usage: assay version\n\nPrint the build's version.\n",
}

// subcommands are the commands each command with commands of its own
// takes, so a mistyped one is named, --help or not.
var subcommands = map[string][]string{
	"tenant":   tenantVerbs,
	"tenants":  {"seed"},
	"operator": {"token"},
	"work":     {"rerun", "rest", "show", "list", "submit", "get", "watch"},
	"replay":   {"dump", "revalidate", "redrive"},
	"usage":    {"reconcile", "show", "export"},
	"outbox":   {"list", "retry"},
	"rollout":  rolloutVerbs,
}

// devMoved says where the development commands went.
const devMoved = "the development commands are in assay-dev now, which make build builds as bin/assay-dev (cmd/assay/assay-dev): "

// movedCommands are the development commands, which were in assay and are
// now in assay-dev: they run the cells in the process and so link the
// services, which the operator's tool does not.
var movedCommands = map[string]string{
	"dev":   devMoved + "bin/assay-dev dev [--serve], or make demo and make serve",
	"bench": devMoved + "bin/assay-dev bench goodput|pipeline|parts|cells|move, or make bench-goodput and make bench",
	"sim":   devMoved + "bin/assay-dev sim [--addr HOST:PORT]",
}

// tool is assay's commands.
var tool = &cli.Tool{Name: "assay", Usage: mainUsage, Helps: helps, Subcommands: subcommands, Moved: movedCommands}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	return tool.Main(args, stderr, func(ctx context.Context, name string, args []string) error {
		return command(ctx, name, args, stderr)
	})
}

// command runs one of assay's commands; usage export tells its progress
// on stderr.
func command(ctx context.Context, name string, args []string, stderr io.Writer) error {
	switch name {
	case "migrate":
		return migrate(ctx, args)
	case "tenants":
		return tenants(ctx, args)
	case "tenant":
		return tenantCmd(ctx, args, os.Stdout)
	case "operator":
		return operatorCmd(ctx, args, os.Stdout)
	case "work":
		return workCmd(ctx, args, os.Stdout)
	case "replay":
		return replayCmd(ctx, args, os.Stdout)
	case "streams":
		return streamsCmd(ctx, args, os.Stdout)
	case "outbox":
		return outboxCmd(ctx, args, os.Stdout)
	case "publish":
		return publishCmd(ctx, args, os.Stdout)
	case "rollout":
		return rolloutCmd(ctx, args, os.Stdout)
	case "nats-config":
		return natsConfig(args, os.Stdout)
	case "usage":
		return usageCmd(ctx, args, os.Stdout, stderr)
	case "version":
		if len(args) > 0 {
			return cli.ConfigError{Err: fmt.Errorf("takes no arguments, got %q", args[0])}
		}
		fmt.Println("assay", buildinfo.Read())
		return nil
	}
	return fmt.Errorf("no command %s", name)
}

func migrate(ctx context.Context, args []string) error {
	create := false
	var rest []string
	for _, a := range args {
		if a == "--create-database" || a == "-create-database" {
			create = true
			continue
		}
		rest = append(rest, a)
	}
	cfg, err := config.Load("assay migrate", rest, os.Getenv, config.Need{})
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	if create {
		made, err := store.EnsureDatabase(ctx, cfg.DatabaseURL)
		if err != nil {
			return fmt.Errorf("ASSAY_DATABASE_URL: %w", config.RedactError(err, cfg.DatabaseURL))
		}
		if made {
			fmt.Printf("region %s: database created\n", cfg.Region)
		}
	}
	st, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		if store.SQLState(err) == "3D000" && !create {
			return fmt.Errorf("ASSAY_DATABASE_URL: %w (create it first, or run assay migrate --create-database)", config.RedactError(err, cfg.DatabaseURL))
		}
		return fmt.Errorf("ASSAY_DATABASE_URL: %w", config.RedactError(err, cfg.DatabaseURL))
	}
	defer st.Close()
	applied, err := st.Migrate(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("region %s: %d migration(s) applied %v\n", cfg.Region, len(applied), applied)
	return nil
}

func tenants(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return cli.ConfigError{Err: fmt.Errorf("usage: assay tenants seed FILE [flags] (one tenant at a time: assay tenant add ID …)")}
	}
	raw, err := os.ReadFile(args[1])
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	var seeds []store.TenantSeed
	if err := json.Unmarshal(raw, &seeds); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("%s: %w", args[1], err)}
	}
	for i, t := range seeds {
		if !event.ValidToken(t.ID) {
			return cli.ConfigError{Err: fmt.Errorf("%s[%d]: tenant id %q: use 1-63 lowercase letters, digits and '-'", args[1], i, t.ID)}
		}
		if !store.ValidToken(t.Token) {
			return cli.ConfigError{Err: fmt.Errorf("%s[%d]: tenant %q: the token is not 24 to 256 letters, digits and _.~- (a placeholder?)", args[1], i, t.ID)}
		}
	}
	cfg, err := config.Load("assay tenants seed", args[2:], os.Getenv, config.Need{})
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	for _, t := range seeds {
		if err := config.ValidateRegion(cfg.Regions, t.HomeRegion); err != nil {
			return cli.ConfigError{Err: fmt.Errorf("%s: tenant %q: homeRegion: %w", args[1], t.ID, err)}
		}
	}
	st, err := openStore(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	if err := st.SeedTenants(ctx, seeds); err != nil {
		return err
	}
	fmt.Printf("region %s: %d tenant(s) seeded\n", cfg.Region, len(seeds))
	return nil
}

// natsConfig prints the NATS server configuration of an installation's
// cells: `assay nats-config [--installation NAME] [--cells us,eu]
// [--passwords FILE [--service-urls FILE] [--server-url URL]]`. With
// --passwords it also writes a fresh password for every user, as the
// server's environment, and with --service-urls each service's
// ASSAY_NATS_URL; neither file may exist yet.
func natsConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay nats-config", flag.ContinueOnError)
	inst := fs.String("installation", envOr("ASSAY_INSTALLATION", event.DefaultInstallation), "installation name ($ASSAY_INSTALLATION)")
	cells := fs.String("cells", envOr("ASSAY_REGIONS", strings.Join(config.DefaultRegions, ",")),
		"cells, comma separated, each a region's name or cell:region for another cell of a region (default $ASSAY_REGIONS)")
	passwords := fs.String("passwords", "", "also write FILE (new, mode 0600): a fresh random password per user, NAME=value lines for the server's environment")
	urls := fs.String("service-urls", "", "with --passwords, also write FILE (new, mode 0600): each service's ASSAY_NATS_URL with its user and password")
	server := fs.String("server-url", "nats://127.0.0.1:4222", "where the services reach the server, in --service-urls")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: err}
	}
	if fs.NArg() > 0 {
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	list := strings.Split(*cells, ",")
	seen := map[string]bool{}
	for _, spec := range list {
		c, err := natsconf.ParseCell(strings.TrimSpace(spec))
		if err != nil {
			return cli.ConfigError{Err: fmt.Errorf("--cells: %w", err)}
		}
		if seen[c.ID] {
			return cli.ConfigError{Err: fmt.Errorf("--cells: cell %s is named twice", c.ID)}
		}
		seen[c.ID] = true
	}
	if !event.ValidToken(*inst) {
		return cli.ConfigError{Err: fmt.Errorf("--installation: %q is not an installation name (lower-case letters, digits, hyphens)", *inst)}
	}
	if *passwords != "" || *urls != "" {
		if err := natsCredentials(*inst, list, *passwords, *urls, *server); err != nil {
			return err
		}
	}
	_, err := io.WriteString(stdout, natsconf.Render(*inst, list))
	return err
}

// natsCredentials writes the files of --passwords and --service-urls.
func natsCredentials(inst string, cells []string, passwords, urls, server string) error {
	if passwords == "" {
		return cli.ConfigError{Err: fmt.Errorf("--service-urls needs --passwords: the URLs carry the passwords drawn for the server")}
	}
	if urls != "" && filepath.Clean(urls) == filepath.Clean(passwords) {
		return cli.ConfigError{Err: fmt.Errorf("--passwords and --service-urls name the same file")}
	}
	srv, err := natsconf.ParseServer(server)
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--server-url: %w", err)}
	}
	creds, err := natsconf.NewCredentials(inst, cells)
	if err != nil {
		return err
	}
	files := []natsconf.SecretFile{{Path: passwords, Content: natsconf.ServerEnv(creds)}}
	if urls != "" {
		files = append(files, natsconf.SecretFile{Path: urls, Content: natsconf.ServiceURLs(creds, srv)})
	}
	return natsconf.WriteSecrets(files...)
}

// regionsOnly reads only ASSAY_REGIONS from the environment, for commands
// whose other settings come from their own flags.
func regionsOnly(k string) string {
	if k == "ASSAY_REGIONS" {
		return os.Getenv(k)
	}
	return ""
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}
