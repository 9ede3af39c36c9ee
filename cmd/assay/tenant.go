package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

const tenantUsage = `usage: assay tenant <command> [args] [--region R --database-url URL]

  add ID --home-region R [--budget-usd N --period month|day] [--token-from FILE] [--token-out FILE]
                              create a tenant with a new API token, printed once (or
                              written to --token-out, mode 0600); --token-from installs
                              the token minted in another cell, so one token works
                              everywhere (a cell that is not its home answers 421)
  list [--json]               the tenants this cell knows, with their GitHub links
  rotate-token ID [--token-from FILE] [--token-out FILE]
                              revoke every token of ID and add a new one (mint it in
                              one cell, install it in the others with --token-from)
  suspend ID | resume ID      refuse (403) or accept the tenant's requests again
  set-budget ID --usd N|--unlimited [--period month|day]
                              the budget counts what ID spent in the current period
                              before it was set (from the ledger), and says how much
  set-rate ID --per-minute N --burst N
                              admission rate per lane: over it API calls get 429,
                              webhook work is dropped with a re-run command
  set-weight ID --weight N    ID's weight (1-1000, default 1) in its lanes' fair
                              share: waiting beside other tenants, it is served
                              N turns for each one of a weight-1 tenant
  link ID github_installation INSTALLATION_ID --repositories owner/*,owner/repo
                              map a GitHub App installation to ID, for the
                              repositories it covers (deliveries naming any
                              other are refused, 403, with nothing fetched)
  link ID github_repository owner/repo
                              map a repository's webhook to ID
  webhook-secret ID           give ID a new secret for its repository hooks
                              (replacing the old one); printed once
  callback ID --url URL | --off
                              send ID's outcomes to URL as signed callbacks
                              (Standard Webhooks) with a new whsec_ secret,
                              printed once; --off stops them
  check-policy ID advisory|blocking
                              advisory (the default): a check run never fails;
                              blocking: a blocking finding fails it
  cost-cap ID MICROS|off      the most one of ID's work items may cost at its
                              calls' estimates, in micro-dollars, over the
                              cell's ASSAY_WORK_COST_CAP_MICROS and the
                              contract's: a review in parts stops there and is
                              published as a partial review

  place ID [--cell C]         serve ID from cell C of its region (default: the cell
                              serving the fewest tenants), in the region's placement
                              map; the region's other cells send its requests there
  placement [--json]          the region's cells, where each answers, and its tenants
  move ID --to C --to-database-url URL [--settle 2m]
                              move ID from the cell that serves it (ASSAY_DATABASE_URL)
                              to cell C of the region: its requests are held (503)
                              while its work in flight ends, its history is copied to
                              C and removed here, and C serves it from then on; a cell
                              of another region (eu, eu-2) is refused before anything
                              is held: a move is not a change of region

place, placement and move read and write the region's placement map, in the
region's account (ASSAY_PLACEMENT_NATS_URL, with the cell's placer user) or,
without it, the cell's (ASSAY_NATS_URL);
the others (and move) the cell's Postgres. Tenants are per cell: run each command against every cell, so that a cell
can name the right region for a tenant homed elsewhere. A token file holds
the token alone; - reads it from standard input.

Settings: --region (ASSAY_REGION) and --database-url (ASSAY_DATABASE_URL), and for
place, placement and move ASSAY_PLACEMENT_NATS_URL or ASSAY_NATS_URL.
`

// tenantVerbs are assay tenant's commands, in the order its usage lists
// them, and tenantArgs how many arguments each takes.
var (
	tenantVerbs = []string{"add", "list", "rotate-token", "suspend", "resume", "set-budget", "set-rate", "set-weight",
		"link", "webhook-secret", "callback", "check-policy", "cost-cap", "place", "placement", "move"}
	tenantArgs = map[string]int{"add": 1, "list": 0, "rotate-token": 1, "suspend": 1, "resume": 1, "set-budget": 1,
		"set-rate": 1, "set-weight": 1, "link": 3, "webhook-secret": 1, "callback": 1, "check-policy": 2,
		"cost-cap": 2, "place": 1, "placement": 0, "move": 1}
)

// tenantFlags are the flags of a tenant command (but place, placement and
// move), its positional arguments, and which flags were set.
type tenantFlags struct {
	home, period, repos, tokenFrom, tokenOut string
	usd, setUSD                              float64
	unlimited, asJSON, callbackOff           bool
	perMinute, burst, weight                 int
	callbackURL                              string
	region, dbURL                            string
	pos                                      []string
	set                                      map[string]bool
}

// parseTenantFlags reads a tenant command's flags, wherever they stand
// among its arguments.
func parseTenantFlags(verb string, args []string) (*tenantFlags, error) {
	f := &tenantFlags{set: map[string]bool{}}
	fs := flag.NewFlagSet("assay tenant "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.home, "home-region", "", "the tenant's home region")
	fs.Float64Var(&f.usd, "budget-usd", -1, "budget per period in US dollars")
	fs.Float64Var(&f.setUSD, "usd", -1, "budget per period in US dollars")
	fs.BoolVar(&f.unlimited, "unlimited", false, "remove the budget")
	fs.StringVar(&f.period, "period", "month", "budget period: month or day")
	fs.IntVar(&f.perMinute, "per-minute", 0, "admitted requests per minute, per lane")
	fs.IntVar(&f.burst, "burst", 0, "requests admitted at once above the rate")
	fs.IntVar(&f.weight, "weight", 0, "fair-share weight, 1 to 1000")
	fs.StringVar(&f.repos, "repositories", "", "the repositories an installation covers: owner/* or owner/repo, comma-separated")
	fs.StringVar(&f.tokenFrom, "token-from", "", "install the token in FILE (- for standard input) instead of minting one")
	fs.StringVar(&f.tokenOut, "token-out", "", "write the new token to FILE (mode 0600) instead of printing it")
	fs.BoolVar(&f.asJSON, "json", false, "list as JSON")
	fs.StringVar(&f.callbackURL, "url", "", "the endpoint signed callbacks are sent to")
	fs.BoolVar(&f.callbackOff, "off", false, "stop the tenant's callbacks")
	fs.StringVar(&f.region, "region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	var err error
	if f.pos, err = parseArgs(fs, args, tenantUsage); err != nil {
		return nil, err
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return f, nil
}

// validate checks the flags and the arguments of verb (args being the
// whole command line, for an unknown verb's message).
func (f *tenantFlags) validate(verb string, args []string) error {
	for name, v := range map[string]float64{"usd": f.setUSD, "budget-usd": f.usd} {
		if f.set[name] && v < 0 {
			return cli.ConfigError{Err: fmt.Errorf("--%s: %s is negative: a budget is 0 dollars or more (--unlimited removes it)", name, strconv.FormatFloat(v, 'f', -1, 64))}
		}
	}
	if f.period != "month" && f.period != "day" {
		return cli.ConfigError{Err: fmt.Errorf("--period: %q is not month or day", f.period)}
	}
	if err := tenantFlagError(verb, f.set, f.unlimited, f.perMinute, f.burst, f.weight, f.callbackURL, f.callbackOff); err != nil {
		return cli.ConfigError{Err: err}
	}
	n, known := tenantArgs[verb]
	if !known {
		return tool.UnknownSub("tenant", args)
	}
	if len(f.pos) != n {
		return cli.ConfigError{Err: fmt.Errorf("tenant %s takes %d argument(s), got %d\n%s", verb, n, len(f.pos), tenantUsage)}
	}
	if n > 0 && !event.ValidToken(f.pos[0]) {
		return cli.ConfigError{Err: fmt.Errorf("tenant id %q: use 1-63 lowercase letters, digits and '-', starting with a letter or digit", f.pos[0])}
	}
	return nil
}

// tenantRun is one tenant command at work: its flags and the cell's
// settings and store.
type tenantRun struct {
	*tenantFlags
	cfg config.Config
	st  *store.Store
}

// tenantCmd runs `assay tenant …` against the cell in ASSAY_DATABASE_URL.
func tenantCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return tool.UnknownSub("tenant", nil)
	}
	if cli.IsHelp(args) {
		fmt.Fprint(stdout, tenantUsage)
		return nil
	}
	verb, rest := args[0], args[1:]
	if verb == "move" {
		if err := refuseMoveOutOfRegion(ctx, rest); err != nil {
			return err
		}
	}
	if verb == "place" || verb == "placement" || verb == "move" {
		return placeCmd(ctx, verb, rest, stdout)
	}
	f, err := parseTenantFlags(verb, rest)
	if err != nil {
		return err
	}
	t := &tenantRun{tenantFlags: f}
	t.cfg, err = config.Load("assay tenant", []string{"--region", f.region, "--database-url", f.dbURL}, regionsOnly, config.Need{})
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	if err := f.validate(verb, args); err != nil {
		return err
	}
	if t.st, err = openStore(ctx, f.dbURL); err != nil {
		return err
	}
	defer t.st.Close()
	if _, err := t.st.Migrate(ctx); err != nil {
		return err
	}
	switch verb {
	case "add":
		return t.add(ctx, stdout)
	case "list":
		return listTenants(ctx, t.st, stdout, f.asJSON)
	case "rotate-token":
		return t.rotateToken(ctx, stdout)
	case "suspend", "resume":
		return t.setStatus(ctx, verb, stdout)
	case "set-budget":
		return t.setBudget(ctx, stdout)
	case "set-rate":
		return t.setRate(ctx, stdout)
	case "set-weight":
		return t.setWeight(ctx, stdout)
	case "link":
		return t.link(ctx, stdout)
	case "webhook-secret":
		return t.webhookSecret(ctx, stdout)
	case "callback":
		return t.callback(ctx, stdout)
	case "check-policy":
		return t.checkPolicy(ctx, stdout)
	case "cost-cap":
		return t.costCap(ctx, stdout)
	}
	return nil
}

// notFound names the tenant a store.ErrNotFound is about.
func (t *tenantRun) notFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no tenant %q in region %s's database", t.pos[0], t.region)
	}
	return err
}

// add runs `tenant add`.
func (t *tenantRun) add(ctx context.Context, stdout io.Writer) error {
	if err := config.ValidateRegion(t.cfg.Regions, t.home); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--home-region: %w", err)}
	}
	tok, err := token(t.tokenFrom)
	if err != nil {
		return err
	}
	if err := t.st.AddTenant(ctx, t.pos[0], t.home, tok); err != nil {
		if errors.Is(err, store.ErrExists) {
			return fmt.Errorf("tenant %s already exists in region %s's database (rotate-token gives it a new token)", t.pos[0], t.region)
		}
		return err
	}
	if t.set["budget-usd"] {
		if _, err := setBudget(ctx, t.st, t.pos[0], t.usd, false, t.period); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "tenant %s added (home region %s)\n", t.pos[0], t.home)
	return showToken(stdout, tok, t.tokenFrom, t.tokenOut)
}

// rotateToken runs `tenant rotate-token`.
func (t *tenantRun) rotateToken(ctx context.Context, stdout io.Writer) error {
	tok, err := token(t.tokenFrom)
	if err != nil {
		return err
	}
	if err := t.st.RotateToken(ctx, t.pos[0], tok); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "every earlier token of %s is revoked\n", t.pos[0])
	return showToken(stdout, tok, t.tokenFrom, t.tokenOut)
}

// setStatus runs `tenant suspend` and `tenant resume`.
func (t *tenantRun) setStatus(ctx context.Context, verb string, stdout io.Writer) error {
	status := map[string]string{"suspend": "suspended", "resume": "active"}[verb]
	if err := t.st.SetStatus(ctx, t.pos[0], status); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "tenant %s is %s\n", t.pos[0], status)
	return nil
}

// setBudget runs `tenant set-budget`: the budget counts what the tenant
// spent in the current period before it was set, and says so.
func (t *tenantRun) setBudget(ctx context.Context, stdout io.Writer) error {
	b, err := setBudget(ctx, t.st, t.pos[0], t.setUSD, t.unlimited, t.period)
	if err != nil {
		return t.notFound(err)
	}
	since := b.PeriodStart.Format(time.RFC3339)
	if t.unlimited {
		fmt.Fprintf(stdout, "tenant %s has no budget; spent so far this %s (since %s): %s\n", t.pos[0], t.period, since,
			usd(b.SpentMicros)[0])
		return nil
	}
	m := usd(b.SpentMicros, b.LimitMicros, b.ReservedMicros, max(b.LimitMicros-b.SpentMicros-b.ReservedMicros, 0))
	fmt.Fprintf(stdout, "tenant %s budget set: %s a %s\n", t.pos[0], m[1], t.period)
	fmt.Fprintf(stdout, "spent so far this %s (since %s, from the ledger): %s of %s\n", t.period, since, m[0], m[1])
	switch {
	case b.SpentMicros >= b.LimitMicros:
		fmt.Fprintf(stdout, "nothing is left: its work ends budget_exhausted, without a call, until the %s ends\n", t.period)
	case b.ReservedMicros > 0:
		fmt.Fprintf(stdout, "left: %s, and %s more held for calls in flight\n", m[3], m[2])
	default:
		fmt.Fprintf(stdout, "left: %s\n", m[3])
	}
	return nil
}

// setRate runs `tenant set-rate`.
func (t *tenantRun) setRate(ctx context.Context, stdout io.Writer) error {
	if err := t.st.SetRate(ctx, t.pos[0], t.perMinute, t.burst); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "tenant %s admits %d per minute per lane, burst %d\n", t.pos[0], t.perMinute, t.burst)
	return nil
}

// setWeight runs `tenant set-weight`.
func (t *tenantRun) setWeight(ctx context.Context, stdout io.Writer) error {
	if err := t.st.SetWeight(ctx, t.pos[0], t.weight); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "tenant %s has weight %d in its lanes' fair share (classifiers read it within %s)\n", t.pos[0], t.weight, "10s")
	return nil
}

// link runs `tenant link`.
func (t *tenantRun) link(ctx context.Context, stdout io.Writer) error {
	l, err := linkOf(t.pos, t.repos)
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	if err := t.st.LinkSource(ctx, l); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s now belongs to tenant %s\n", t.pos[1], t.pos[2], t.pos[0])
	if len(l.Repositories) > 0 {
		fmt.Fprintf(stdout, "it covers %s\n", strings.Join(l.Repositories, ", "))
	}
	return nil
}

// webhookSecret runs `tenant webhook-secret`.
func (t *tenantRun) webhookSecret(ctx context.Context, stdout io.Writer) error {
	secret := store.NewWebhookSecret()
	if err := t.st.SetWebhookSecret(ctx, t.pos[0], secret); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "tenant %s webhook secret (shown once; set it on each repository hook linked to %s): %s\n", t.pos[0], t.pos[0], secret)
	return nil
}

// callback runs `tenant callback`.
func (t *tenantRun) callback(ctx context.Context, stdout io.Writer) error {
	if t.callbackOff {
		if err := t.st.SetCallback(ctx, t.pos[0], store.Callback{}); err != nil {
			return t.notFound(err)
		}
		fmt.Fprintf(stdout, "tenant %s gets no callbacks\n", t.pos[0])
		return nil
	}
	secret := store.NewCallbackSecret()
	if err := t.st.SetCallback(ctx, t.pos[0], store.Callback{URL: t.callbackURL, Secret: secret}); err != nil {
		return t.notFound(err)
	}
	fmt.Fprintf(stdout, "tenant %s outcomes go to %s, signed (webhook-signature) with (shown once): %s\n", t.pos[0], t.callbackURL, secret)
	return nil
}

// checkPolicy runs `tenant check-policy`.
func (t *tenantRun) checkPolicy(ctx context.Context, stdout io.Writer) error {
	if err := t.st.SetCheckPolicy(ctx, t.pos[0], t.pos[1]); errors.Is(err, store.ErrNotFound) {
		return t.notFound(err)
	} else if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("check-policy: %q is not advisory or blocking", t.pos[1])}
	}
	fmt.Fprintf(stdout, "tenant %s check runs are %s\n", t.pos[0], t.pos[1])
	return nil
}

// costCap runs `tenant cost-cap`.
func (t *tenantRun) costCap(ctx context.Context, stdout io.Writer) error {
	micros, err := costCapArg(t.pos[1])
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	if err := t.st.SetWorkCostCap(ctx, t.pos[0], micros); err != nil {
		return t.notFound(err)
	}
	if micros == 0 {
		fmt.Fprintf(stdout, "tenant %s has no cost cap of its own\n", t.pos[0])
		return nil
	}
	fmt.Fprintf(stdout, "tenant %s work items cost at most %d micro-dollars each at their estimates\n", t.pos[0], micros)
	return nil
}

// costCapArg reads cost-cap's MICROS: a positive whole number, or off (0).
func costCapArg(arg string) (int64, error) {
	if arg == "off" {
		return 0, nil
	}
	n, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("cost-cap: %q is not a positive number of micro-dollars or off", arg)
	}
	return n, nil
}

// tenantFlagError checks a tenant command's flags before the cell's
// database is opened.
func tenantFlagError(verb string, set map[string]bool, unlimited bool, perMinute, burst, weight int, callbackURL string, off bool) error {
	switch verb {
	case "set-budget":
		if set["usd"] == unlimited {
			return errors.New("set-budget takes exactly one of --usd N or --unlimited")
		}
	case "set-rate":
		if perMinute < 1 || burst < 1 {
			return errors.New("set-rate needs --per-minute N and --burst N, both at least 1")
		}
	case "set-weight":
		if weight < 1 || weight > store.MaxWeight {
			return fmt.Errorf("set-weight needs --weight N, 1 to %d", store.MaxWeight)
		}
	case "callback":
		if (callbackURL == "") == !off {
			return errors.New("callback takes exactly one of --url URL or --off")
		}
		if u, err := url.Parse(callbackURL); !off && (err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "") {
			return fmt.Errorf("--url: %q is not an http(s) URL", callbackURL)
		}
	}
	return nil
}

// token is a new tenant token, or the one in file (- for standard input),
// minted in another cell.
func token(file string) (string, error) {
	if file == "" {
		return store.NewToken(), nil
	}
	var raw []byte
	var err error
	if file == "-" {
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, 4096))
	} else {
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return "", cli.ConfigError{Err: fmt.Errorf("--token-from: %w", err)}
	}
	tok := strings.TrimSpace(string(raw))
	if !store.ValidToken(tok) {
		return "", cli.ConfigError{Err: fmt.Errorf("--token-from %s: not a token (24 to 256 letters, digits and _.~-)", file)}
	}
	return tok, nil
}

// showToken tells the operator the token: printed once, or written to out;
// a token installed from elsewhere is not printed again.
func showToken(stdout io.Writer, tok, from, out string) error {
	switch {
	case out != "":
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return cli.ConfigError{Err: fmt.Errorf("--token-out: %w", err)}
		}
		if _, err := fmt.Fprintln(f, tok); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "token written to %s (stored here hashed); install it in the other cells with --token-from\n", out)
	case from != "":
		fmt.Fprintln(stdout, "token installed from", from, "(stored hashed)")
	default:
		fmt.Fprintf(stdout, "token (shown once, stored hashed; install it in the other cells with --token-from): %s\n", tok)
	}
	return nil
}

// tenantLine is one tenant as `tenant list --json` shows it.
type tenantLine struct {
	ID            string     `json:"id"`
	HomeRegion    string     `json:"homeRegion"`
	Status        string     `json:"status"`
	RatePerMinute int        `json:"ratePerMinute"`
	Burst         int        `json:"burst"`
	BudgetUSD     *float64   `json:"budgetUsd"`
	BudgetPeriod  string     `json:"budgetPeriod"`
	ActiveTokens  int        `json:"activeTokens"`
	Links         []linkLine `json:"links"`
}

type linkLine struct {
	Kind         string   `json:"kind"`
	Key          string   `json:"key"`
	Repositories []string `json:"repositories,omitempty"`
}

func listTenants(ctx context.Context, st *store.Store, stdout io.Writer, asJSON bool) error {
	ts, err := st.ListTenants(ctx)
	if err != nil {
		return err
	}
	links, err := st.Links(ctx)
	if err != nil {
		return err
	}
	byTenant := map[string][]store.Link{}
	for _, l := range links {
		byTenant[l.Tenant] = append(byTenant[l.Tenant], l)
	}
	if asJSON {
		out := make([]tenantLine, 0, len(ts))
		for _, t := range ts {
			l := tenantLine{ID: t.ID, HomeRegion: t.HomeRegion, Status: t.Status, RatePerMinute: t.RatePerMinute, Burst: t.Burst,
				BudgetPeriod: t.BudgetPeriod, ActiveTokens: t.ActiveTokens, Links: []linkLine{}}
			for _, k := range byTenant[t.ID] {
				l.Links = append(l.Links, linkLine{Kind: k.Kind, Key: k.Key, Repositories: k.Repositories})
			}
			if t.BudgetMicros != nil {
				usd := float64(*t.BudgetMicros) / 1e6
				l.BudgetUSD = &usd
			}
			out = append(out, l)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tHOME\tSTATUS\tRATE/MIN\tBURST\tBUDGET (USD)\tPERIOD\tTOKENS\tGITHUB")
	for _, t := range ts {
		b := "unlimited"
		if t.BudgetMicros != nil {
			b = cli.Dollars(*t.BudgetMicros)
		}
		var gh []string
		for _, l := range byTenant[t.ID] {
			s := strings.TrimPrefix(l.Kind, "github_") + " " + l.Key
			if len(l.Repositories) > 0 {
				s += " (" + strings.Join(l.Repositories, ",") + ")"
			}
			gh = append(gh, s)
		}
		if len(gh) == 0 {
			gh = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", t.ID, t.HomeRegion, t.Status, t.RatePerMinute, t.Burst,
			b, t.BudgetPeriod, t.ActiveTokens, strings.Join(gh, "; "))
	}
	return tw.Flush()
}

// linkOf is the link `tenant link ID KIND KEY` asks for, checked.
func linkOf(pos []string, repos string) (store.Link, error) {
	l := store.Link{Tenant: pos[0], Kind: pos[1], Key: pos[2]}
	switch l.Kind {
	case store.SourceGitHubInstallation:
		if id, err := strconv.ParseInt(l.Key, 10, 64); err != nil || id <= 0 || strconv.FormatInt(id, 10) != l.Key {
			return l, fmt.Errorf("installation id %q is not a positive decimal number", l.Key)
		}
		for _, p := range strings.Split(repos, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			if !api.RepositoryPatternOK(p) {
				return l, fmt.Errorf("--repositories: %q is not owner/* or owner/repo", p)
			}
			l.Repositories = append(l.Repositories, p)
		}
		if len(l.Repositories) == 0 {
			return l, errors.New("an installation link needs --repositories owner/*,owner/repo: the repositories the installation may speak for")
		}
	case store.SourceGitHubRepository:
		if !api.RepositoryPatternOK(l.Key) || strings.HasSuffix(l.Key, "/*") {
			return l, fmt.Errorf("repository %q is not owner/repo", l.Key)
		}
		if repos != "" {
			return l, errors.New("--repositories is for an installation link; a repository link names one repository")
		}
	default:
		return l, fmt.Errorf("link kind %q is not github_installation or github_repository", l.Kind)
	}
	return l, nil
}

// setBudget sets the tenant's budget and returns its standing in the
// period that holds now, the spend before the budget counted.
func setBudget(ctx context.Context, st *store.Store, id string, amount float64, unlimited bool, period string) (store.Budget, error) {
	if unlimited {
		return st.SetBudgetCounted(ctx, id, nil, period)
	}
	if math.IsInf(amount, 0) || math.IsNaN(amount) || amount > 1e9 {
		return store.Budget{}, cli.ConfigError{Err: fmt.Errorf("budget %s is not a sensible amount of dollars", strconv.FormatFloat(amount, 'f', -1, 64))}
	}
	micros := int64(math.Round(amount * 1e6))
	return st.SetBudgetCounted(ctx, id, &micros, period)
}

// usd prints amounts of micro-dollars as dollars, each with the fewest
// decimals (2 to 6) that show all of them exactly: $0.0079 of $0.0080.
func usd(micros ...int64) []string {
	d, unit := 2, int64(10_000)
	for _, m := range micros {
		for d < 6 && m%unit != 0 {
			d, unit = d+1, unit/10
		}
	}
	out := make([]string, len(micros))
	for i, m := range micros {
		out[i] = fmt.Sprintf("$%.*f", d, float64(m)/1e6)
	}
	return out
}

// moveArgs are what refuseMoveOutOfRegion reads of a move's command line.
type moveArgs struct{ tenant, to, region, dbURL string }

// parseMoveArgs reads a move's command line as placeCmd does; ok is false
// when it is not one placeCmd takes, which placeCmd then names.
func parseMoveArgs(args []string) (m moveArgs, ok bool) {
	fs := flag.NewFlagSet("assay tenant move", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&m.to, "to", "", "")
	fs.StringVar(&m.region, "region", os.Getenv("ASSAY_REGION"), "")
	fs.StringVar(&m.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "")
	fs.String("to-database-url", "", "")
	fs.String("cell", "", "")
	fs.Duration("settle", 0, "")
	fs.Bool("json", false, "")
	pos, err := parseArgs(fs, args, tenantUsage)
	if err != nil || len(pos) != 1 || !event.ValidToken(pos[0]) || !event.ValidToken(m.to) {
		return m, false
	}
	m.tenant = pos[0]
	return m, true
}

// cellRegion is the region a cell belongs to by its name: a region's own
// cell is named after the region, its other cells after the region and a
// suffix (us-2). It is "" when the name is none of these.
func cellRegion(regions []string, cell string) string {
	best := ""
	for _, r := range regions {
		if (cell == r || strings.HasPrefix(cell, r+"-")) && len(r) > len(best) {
			best = r
		}
	}
	return best
}

// refuseMoveOutOfRegion refuses `tenant move` to a cell of another region
// than the tenant's, or than the region whose placement map the move
// would write, before anything is held: a move goes between the cells of
// one region, and a tenant's region is not changed by moving it.
func refuseMoveOutOfRegion(ctx context.Context, args []string) error {
	m, ok := parseMoveArgs(args)
	if !ok || m.dbURL == "" {
		return nil
	}
	regions, err := config.ParseRegions(envOr("ASSAY_REGIONS", strings.Join(config.DefaultRegions, ",")))
	if err != nil {
		return nil
	}
	target := cellRegion(regions, m.to)
	if target == "" {
		return nil
	}
	st, err := openStore(ctx, m.dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	home, err := st.TenantRegion(ctx, m.tenant)
	if errors.Is(err, store.ErrNotFound) {
		return cli.ConfigError{Err: fmt.Errorf("no tenant %q in the database of the cell that serves it (ASSAY_DATABASE_URL); nothing was held", m.tenant)}
	}
	if err != nil {
		return err
	}
	switch {
	case home != target:
		return cli.ConfigError{Err: fmt.Errorf("tenant %s is of region %s, and cell %s is of region %s: a move goes between cells of "+
			"the tenant's own region (%s), and a move to another region is not a cell move; nothing was held",
			m.tenant, home, m.to, target, home)}
	case m.region != "" && m.region != target:
		return cli.ConfigError{Err: fmt.Errorf("cell %s is of region %s (tenant %s's), and this is region %s's placement map "+
			"(ASSAY_REGION, --region): run the move with region %s; nothing was held", m.to, target, m.tenant, m.region, target)}
	}
	return nil
}
