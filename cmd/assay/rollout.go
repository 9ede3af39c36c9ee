package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

const rolloutUsage = `usage: assay rollout COMMAND [flags]

Versions of a contract side by side: which one new work gets, a candidate
(another version, model or prompt) tried on the evaluation set and in the
shadow of live work, and its promotion.

  check --contract NAME --version V [--model M] [--prompt FILE] --tenant T
        [--out DIR] [--timeout 10m] [--samples 3] [--min-transport 1]
        [--min-structural 1] [--usefulness-slack 0]
      run the contract's evaluation set through the cell as shadow work
      (nothing published, no review items, its calls ledgered as shadow
      and charged to T), each item --samples times (1 to 20) with the
      candidate and as often with what T's new work gets now; print each
      signal's mean and spread between samples (transport, structural and
      the set's usefulness measures) per item and in total, and the items
      whose samples disagree; write rollout-check-ID.json and .md in DIR
      (.), and exit 1 unless the candidate's transport and structural
      shares reach their minimums and no usefulness measure is below the
      live variant's by more than the slack plus two standard errors of
      the difference
  set-live --contract NAME --version V [--model M] [--prompt FILE] [--tenant T]
        [--override --reason TEXT] [--cells C,C | --all-cells]
      what new work gets, at once, only if the last check of exactly that
      version, model and prompt passed (the contract's default version
      with the cell's model and its own prompt needs none); --override
      moves without a passed check, and its reason is kept in the route's
      history; a refusal exits 2
  set-candidate --contract NAME --version V [--model M] [--prompt FILE]
        [--share 0.2] [--tenant T] [--cells C,C | --all-cells]
      the candidate, and the share of live work that also runs with it in
      the shadow (--version none clears it)
  promote --contract NAME [--tenant T] [--override --reason TEXT]
        [--cells C,C | --all-cells]
      the candidate becomes live, only if the last check of exactly its
      version, model and prompt passed (or with --override, as set-live)
  status --contract NAME [--json]
      routes (a live variant an override put there marked, with who and
      why), their recent changes, the last checks, and the shadow
      comparison of the last hour
  compare --contract NAME [--since 1h] [--json]
      the candidate's shadow runs against their live work: structural
      failures, agreement of findings, cost and latency

Without --tenant a route is every tenant's ("*"); a tenant's own route
overrides it. Ingress reads routes every ASSAY_ROUTES_EVERY (5s).

Rollouts are per cell: routes, checks and their history live in the cell's
database, so a change made in one cell leaves every other cell as it was.
set-live, set-candidate and promote take --cells us,eu, or --all-cells (the
cells of ASSAY_CELLS, else a cell per region of ASSAY_REGIONS), to make the
change in each cell named, on its database ASSAY_DATABASE_URL_<CELL> (US,
EU, US_2; the cell of --region may use --database-url instead), each behind
its own fence: its own last check, an override's reason kept in its own
history. Every cell is tried and reported; the command says which moved and
which did not, and exits 2 when only fences refused, 1 on another failure.
`

var rolloutVerbs = []string{"check", "set-live", "set-candidate", "promote", "status", "compare"}

// rolloutTakes are the flags each rollout verb takes, besides --region and
// --database-url.
var rolloutTakes = map[string][]string{
	"check":         {"contract", "version", "model", "prompt", "tenant", "out", "timeout", "samples", "min-transport", "min-structural", "usefulness-slack"},
	"set-live":      {"contract", "version", "model", "prompt", "tenant", "override", "reason", "cells", "all-cells"},
	"set-candidate": {"contract", "version", "model", "prompt", "tenant", "share", "cells", "all-cells"},
	"promote":       {"contract", "tenant", "override", "reason", "cells", "all-cells"},
	"status":        {"contract", "json"},
	"compare":       {"contract", "since", "json"},
}

// rolloutFlags are the flags of a rollout verb, its positional arguments,
// and which flags were set.
type rolloutFlags struct {
	verb                                                 string
	name, version, model, promptFile, tenant, out, since string
	share, minTransport, minStructural, slack            float64
	timeout                                              time.Duration
	asJSON                                               bool
	override                                             bool
	reason                                               string // --reason: why --override moves
	samples                                              int    // check: runs of each item per variant
	cells                                                string // --cells: the cells to change, comma-separated
	allCells                                             bool   // --all-cells
	region, dbURL                                        string
	pos                                                  []string
	set                                                  map[string]bool // the flags given
}

// parseRolloutFlags reads verb's flags, refusing one the verb does not
// take.
func parseRolloutFlags(verb string, args []string) (*rolloutFlags, error) {
	f := &rolloutFlags{verb: verb, set: map[string]bool{}}
	fs := flag.NewFlagSet("assay rollout "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.name, "contract", "", "contract name")
	fs.StringVar(&f.version, "version", "", "schema version")
	fs.StringVar(&f.model, "model", "", "model")
	fs.StringVar(&f.promptFile, "prompt", "", "prompt file")
	fs.StringVar(&f.tenant, "tenant", "", "tenant")
	fs.Float64Var(&f.share, "share", 0, "shadow share")
	fs.StringVar(&f.out, "out", ".", "report directory")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Minute, "check timeout")
	fs.Float64Var(&f.minTransport, "min-transport", 1, "check: minimum transport share")
	fs.Float64Var(&f.minStructural, "min-structural", 1, "check: minimum structural share")
	fs.Float64Var(&f.slack, "usefulness-slack", 0, "check: how far a usefulness measure may fall below live")
	fs.IntVar(&f.samples, "samples", 3, "check: runs of each item per variant")
	fs.StringVar(&f.since, "since", "1h", "compare: since")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.BoolVar(&f.override, "override", false, "set-live, promote: move without a passed check")
	fs.StringVar(&f.reason, "reason", "", "--override: why")
	fs.StringVar(&f.cells, "cells", "", "set-live, set-candidate, promote: the cells to change, comma-separated")
	fs.BoolVar(&f.allCells, "all-cells", false, "set-live, set-candidate, promote: change every cell of the installation")
	fs.StringVar(&f.region, "region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	var err error
	if f.pos, err = parseArgs(fs, args, rolloutUsage); err != nil {
		return nil, err
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for name := range f.set {
		if !slices.Contains(rolloutTakes[verb], name) && name != "region" && name != "database-url" {
			return nil, cli.ConfigError{Err: fmt.Errorf("--%s is not a flag of rollout %s\n%s", name, verb, rolloutUsage)}
		}
	}
	return f, nil
}

// validate checks the flags against each other and the contracts in reg.
func (f *rolloutFlags) validate(reg *contract.Registry) error {
	switch {
	case len(f.pos) > 0:
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", f.pos[0], rolloutUsage)}
	case f.name == "":
		return cli.ConfigError{Err: fmt.Errorf("--contract is required\n%s", rolloutUsage)}
	case len(reg.Versions(f.name)) == 0:
		return cli.ConfigError{Err: fmt.Errorf("--contract: %q is not a contract (known: %s)", f.name, strings.Join(reg.Names(), ", "))}
	case slices.Contains(rolloutTakes[f.verb], "version") && f.version == "":
		return cli.ConfigError{Err: fmt.Errorf("--version is required\n%s", rolloutUsage)}
	case f.share < 0 || f.share > 1:
		return cli.ConfigError{Err: fmt.Errorf("--share: %v is not between 0 and 1", f.share)}
	case f.verb == "set-candidate" && f.version != "none" && f.set["share"] == false:
		return cli.ConfigError{Err: errors.New("--share is required: the share of live work that also runs with the candidate (0 for none)")}
	case f.timeout < 10*time.Second:
		return cli.ConfigError{Err: fmt.Errorf("--timeout: %s is less than 10s", f.timeout)}
	case f.minTransport < 0 || f.minTransport > 1 || f.minStructural < 0 || f.minStructural > 1 || f.slack < 0 || f.slack > 1:
		return cli.ConfigError{Err: errors.New("--min-transport, --min-structural and --usefulness-slack are shares between 0 and 1")}
	case f.verb == "check" && f.tenant == "":
		return cli.ConfigError{Err: errors.New("--tenant is required: the tenant the check's calls are charged to")}
	case f.samples < 1 || f.samples > 20:
		return cli.ConfigError{Err: fmt.Errorf("--samples: %d is not between 1 and 20", f.samples)}
	case f.override && strings.TrimSpace(f.reason) == "":
		return cli.ConfigError{Err: errors.New("--reason is required with --override: why live traffic moves without a passed check")}
	case f.set["reason"] && !f.override:
		return cli.ConfigError{Err: errors.New("--reason is for --override")}
	case f.set["cells"] && f.allCells:
		return cli.ConfigError{Err: errors.New("--cells and --all-cells: give one or the other")}
	case f.set["cells"] && strings.TrimSpace(f.cells) == "":
		return cli.ConfigError{Err: errors.New("--cells: name the cells, comma-separated (us,eu)")}
	}
	return nil
}

// contractOf is the contract version --version names, nil for none.
func (f *rolloutFlags) contractOf(reg *contract.Registry) (*contract.Contract, error) {
	if f.version == "" || f.version == "none" {
		return nil, nil
	}
	c, ok := reg.Of(f.name, f.version)
	if !ok {
		var known []string
		for _, v := range reg.Versions(f.name) {
			known = append(known, v.SchemaVersion)
		}
		return nil, cli.ConfigError{Err: fmt.Errorf("--version: %q is not a version of %s (known: %s)", f.version, f.name, strings.Join(known, ", "))}
	}
	return c, nil
}

// prompt is the text of --prompt's file, "" without one.
func (f *rolloutFlags) prompt() (string, error) {
	if f.promptFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(f.promptFile)
	if err != nil {
		return "", cli.ConfigError{Err: fmt.Errorf("--prompt: %w", err)}
	}
	prompt := string(b)
	if strings.TrimSpace(prompt) == "" {
		return "", cli.ConfigError{Err: fmt.Errorf("--prompt: %s is empty", f.promptFile)}
	}
	return prompt, nil
}

// rolloutRun is one rollout verb at work: its flags, what they name, and the
// cell's store.
type rolloutRun struct {
	*rolloutFlags
	reg    *contract.Registry
	c      *contract.Contract // the version --version names; nil for none
	prompt string
	from   time.Time // --since
	cfg    config.Config
	st     *store.Store
	scope  string
	by     string
}

// rolloutCmd runs `assay rollout …`.
func rolloutCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || !slices.Contains(rolloutVerbs, args[0]) {
		return cli.ConfigError{Err: errors.New(rolloutUsage)}
	}
	f, err := parseRolloutFlags(args[0], args[1:])
	if err != nil {
		return err
	}
	r := &rolloutRun{rolloutFlags: f, scope: cmp.Or(f.tenant, store.RouteAll), by: "assay rollout " + f.verb}
	if r.reg, err = contract.Load(); err != nil {
		return err
	}
	if err := f.validate(r.reg); err != nil {
		return err
	}
	if r.c, err = f.contractOf(r.reg); err != nil {
		return err
	}
	if r.prompt, err = f.prompt(); err != nil {
		return err
	}
	if r.from, err = parseWhen(f.since, time.Now()); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--since: %w", err)}
	}
	if f.set["cells"] || f.allCells {
		return r.everyCell(ctx, stdout)
	}
	if r.cfg, err = loadCell("assay rollout", f.region, f.dbURL); err != nil {
		return err
	}
	if r.st, err = openStore(ctx, f.dbURL); err != nil {
		return err
	}
	defer r.st.Close()
	if f.tenant != "" {
		if err := knownTenant(ctx, r.st, f.tenant); err != nil {
			return err
		}
	}
	switch f.verb {
	case "set-live":
		return r.setLive(ctx, stdout)
	case "set-candidate":
		return r.setCandidate(ctx, stdout)
	case "promote":
		return r.promote(ctx, stdout)
	case "status":
		return rolloutStatus(ctx, r.st, r.reg, f.name, stdout, f.asJSON)
	case "compare":
		return r.compare(ctx, stdout)
	}
	return r.check(ctx, stdout)
}

// variant names c with the model and the prompt given; a prompt of its
// own is stored under its digest, and the version's own is named by none.
func (r *rolloutRun) variant(ctx context.Context) (store.Variant, error) {
	v := store.Variant{Version: r.c.SchemaVersion, Model: r.model}
	if r.prompt != "" && contract.PromptDigest(r.prompt) != r.c.PromptDigest {
		v.Prompt = contract.PromptDigest(r.prompt)
		if err := r.st.PutPrompt(ctx, r.c.Name, v.Prompt, r.prompt); err != nil {
			return v, err
		}
	}
	return v, nil
}

// shipped is the contract as it ships, for the rollout fence.
func (r *rolloutRun) shipped() store.Shipped {
	def, _ := r.reg.Get(r.name)
	return store.Shipped{Default: def.SchemaVersion, OwnPrompt: func(v string) string {
		if c, ok := r.reg.Of(r.name, v); ok {
			return c.PromptDigest
		}
		return ""
	}}
}

// overrideReason is --reason with --override, "" without.
func (r *rolloutRun) overrideReason() string {
	if !r.override {
		return ""
	}
	return strings.TrimSpace(r.reason)
}

// refused is the error of a move the rollout fence refused (exit 2): the
// variant without a passed check, and the check to run.
func (r *rolloutRun) refused(err error) error {
	var u *store.UncheckedError
	if !errors.As(err, &u) {
		return err
	}
	run := fmt.Sprintf("assay rollout check --contract %s --version %s", u.Contract, u.Variant.Version)
	if u.Variant.Model != "" {
		run += " --model " + u.Variant.Model
	}
	var file string
	if u.Variant.Prompt != "" {
		run += " --prompt " + cmp.Or(r.promptFile, "FILE")
		if r.promptFile == "" {
			file = fmt.Sprintf(" (FILE: the prompt of digest %s)", u.Variant.Prompt)
		}
	}
	run += " --tenant " + cmp.Or(r.tenant, "TENANT")
	return cli.ConfigError{Err: fmt.Errorf("not moved: %w; run %s%s, or move anyway with --override --reason TEXT", err, run, file)}
}

// moved says how a change of live traffic got past the fence.
func moved(ch store.RouteChange) string {
	switch {
	case ch.ID == 0:
		return "it was live already"
	case ch.Verb == store.ChangeOverride:
		return fmt.Sprintf("override by %s: %s", ch.By, ch.Reason)
	case ch.CheckID != 0:
		return fmt.Sprintf("check #%d passed", ch.CheckID)
	case ch.From == ch.To:
		return "it was live already"
	}
	return "the contract's default as shipped"
}

// setLive runs `rollout set-live`.
func (r *rolloutRun) setLive(ctx context.Context, stdout io.Writer) error {
	v, err := r.variant(ctx)
	if err != nil {
		return err
	}
	ch, err := r.st.SetLive(ctx, r.scope, r.name, v, r.shipped(), r.overrideReason(), r.by)
	if err != nil {
		return r.refused(err)
	}
	fmt.Fprintf(stdout, "%s for %s: new work gets %s (%s)\n", r.name, scopeWords(r.scope), variantWords(v, r.reg), moved(ch))
	return nil
}

// setCandidate runs `rollout set-candidate`.
func (r *rolloutRun) setCandidate(ctx context.Context, stdout io.Writer) error {
	var v store.Variant
	if r.c != nil {
		var err error
		if v, err = r.variant(ctx); err != nil {
			return err
		}
	}
	if err := r.st.SetCandidate(ctx, r.scope, r.name, v, r.share, r.shipped(), r.by); err != nil {
		return err
	}
	if r.c == nil {
		fmt.Fprintf(stdout, "%s for %s: no candidate\n", r.name, scopeWords(r.scope))
		return nil
	}
	fmt.Fprintf(stdout, "%s for %s: candidate %s, %.0f%% of live work also runs with it in the shadow\n",
		r.name, scopeWords(r.scope), variantWords(v, r.reg), 100*r.share)
	return nil
}

// promote runs `rollout promote`.
func (r *rolloutRun) promote(ctx context.Context, stdout io.Writer) error {
	rt, ch, err := r.st.Promote(ctx, r.scope, r.name, r.shipped(), r.overrideReason(), r.by)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%s for %s has no candidate to promote (assay rollout set-candidate)", r.name, scopeWords(r.scope))
	case err != nil:
		return r.refused(err)
	}
	fmt.Fprintf(stdout, "%s for %s: new work gets %s (%s)\n", r.name, scopeWords(r.scope), variantWords(rt.Live, r.reg), moved(ch))
	return nil
}

// compare runs `rollout compare`.
func (r *rolloutRun) compare(ctx context.Context, stdout io.Writer) error {
	runs, err := r.st.ShadowRuns(ctx, r.name, "", r.from, 10000)
	if err != nil {
		return err
	}
	cmpr := compareRuns(runs)
	if r.asJSON {
		return json.NewEncoder(stdout).Encode(cmpr)
	}
	printComparison(stdout, cmpr)
	return nil
}

func knownTenant(ctx context.Context, st *store.Store, id string) error {
	ts, err := st.ListTenants(ctx)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if t.ID == id {
			return nil
		}
	}
	return cli.ConfigError{Err: fmt.Errorf("--tenant: %q is not a tenant of this cell (assay tenant list)", id)}
}

func scopeWords(scope string) string {
	if scope == store.RouteAll {
		return "every tenant"
	}
	return "tenant " + scope
}

// variantWords says what a variant asks with.
func variantWords(v store.Variant, reg *contract.Registry) string {
	s := v.Version
	if v.Model != "" {
		s += ", model " + v.Model
	} else {
		s += ", the cell's model"
	}
	if v.Prompt != "" {
		s += ", prompt " + store.ShortDigest(v.Prompt)
	} else if c, ok := reg.Version(v.Version); ok {
		s += ", its own prompt " + store.ShortDigest(c.PromptDigest)
	}
	return s
}

// routeOf is the route a scope's new work follows now: its own, every
// tenant's, or the contract's default version.
func routeOf(ctx context.Context, st *store.Store, reg *contract.Registry, scope, name string) store.Route {
	rs, err := st.Routes(ctx)
	if err == nil {
		for _, want := range []string{scope, store.RouteAll} {
			for _, r := range rs {
				if r.Scope == want && r.Contract == name {
					return r
				}
			}
		}
	}
	c, _ := reg.Get(name)
	return store.Route{Scope: store.RouteAll, Contract: name, Live: store.Variant{Version: c.SchemaVersion}}
}

// comparison is the shadow runs of one candidate variant against their
// live work.
type comparison struct {
	Variant store.Variant `json:"variant"`
	Runs    int           `json:"runs"`
	// Ended counts the shadow work that reached an outcome; Accepted, those
	// the gate accepted; StructuralFailures, those it rejected.
	Ended              int `json:"ended"`
	Accepted           int `json:"accepted"`
	StructuralFailures int `json:"structuralFailures"`
	// Compared counts the runs where the shadow and its live work were both
	// accepted; Agreement is their mean agreement (findings at the same
	// places over findings at either, 1 when both found nothing; for a
	// contract without findings, the same answer).
	Compared  int     `json:"compared"`
	Agreement float64 `json:"agreement"`
	// Mean cost and summed call latency per run, of the shadow and of its
	// live work.
	CostMicros     int64 `json:"costMicros"`
	LiveCostMicros int64 `json:"liveCostMicros"`
	LatencyMS      int64 `json:"latencyMs"`
	LiveLatencyMS  int64 `json:"liveLatencyMs"`
}

func compareRuns(runs []store.ShadowRun) []comparison {
	by := map[store.Variant]*comparison{}
	var order []store.Variant
	for _, r := range runs {
		v := store.Variant{Version: r.Work.SchemaVersion, Model: r.Work.Model, Prompt: r.Work.PromptDigest}
		c := by[v]
		if c == nil {
			c = &comparison{Variant: v}
			by[v] = c
			order = append(order, v)
		}
		c.Runs++
		if outcome.IsTerminal(r.Work.State) {
			c.Ended++
		}
		switch r.Work.State {
		case outcome.Accepted:
			c.Accepted++
		case outcome.SchemaRejected:
			c.StructuralFailures++
		}
		c.CostMicros += r.CostMicros
		c.LiveCostMicros += r.LiveCost
		c.LatencyMS += r.LatencyMS
		c.LiveLatencyMS += r.LiveLatency
		if r.Work.State == outcome.Accepted && r.Live != nil && r.Live.State == outcome.Accepted {
			c.Compared++
			c.Agreement += agreement(r.Output, r.LiveOutput)
		}
	}
	out := make([]comparison, 0, len(order))
	for _, v := range order {
		c := *by[v]
		if c.Compared > 0 {
			c.Agreement /= float64(c.Compared)
		}
		if c.Runs > 0 {
			n := int64(c.Runs)
			c.CostMicros, c.LiveCostMicros, c.LatencyMS, c.LiveLatencyMS = c.CostMicros/n, c.LiveCostMicros/n, c.LatencyMS/n, c.LiveLatencyMS/n
		}
		out = append(out, c)
	}
	return out
}

// agreement of two accepted answers: for answers with findings, the
// places (file and line) both report over the places either reports;
// otherwise 1 when they say the same, correlation fields aside.
func agreement(a, b json.RawMessage) float64 {
	fa, errA := evalset.Findings(a)
	fb, errB := evalset.Findings(b)
	if errA == nil && errB == nil {
		at := map[string]bool{}
		for _, f := range fa {
			at[fmt.Sprintf("%s:%d", f.File, f.Line)] = true
		}
		both, either := 0, len(at)
		seen := map[string]bool{}
		for _, f := range fb {
			k := fmt.Sprintf("%s:%d", f.File, f.Line)
			if seen[k] {
				continue
			}
			seen[k] = true
			if at[k] {
				both++
			} else {
				either++
			}
		}
		if either == 0 {
			return 1
		}
		return float64(both) / float64(either)
	}
	norm := func(raw json.RawMessage) string {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil {
			return string(raw)
		}
		for _, k := range []string{"schemaVersion", "schema_version", "changeId"} {
			delete(m, k)
		}
		out, _ := json.Marshal(m)
		return string(out)
	}
	if norm(a) == norm(b) {
		return 1
	}
	return 0
}

func printComparison(w io.Writer, cs []comparison) {
	if len(cs) == 0 {
		fmt.Fprintln(w, "no shadow runs in the window")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CANDIDATE\tRUNS\tENDED\tACCEPTED\tSTRUCTURAL FAILURES\tCOMPARED\tAGREEMENT\tCOST/RUN (µ$)\tLIVE COST/RUN\tLATENCY/RUN\tLIVE LATENCY/RUN")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.2f\t%d\t%d\t%dms\t%dms\n", c.Variant.Label(), c.Runs, c.Ended, c.Accepted,
			c.StructuralFailures, c.Compared, c.Agreement, c.CostMicros, c.LiveCostMicros, c.LatencyMS, c.LiveLatencyMS)
	}
	tw.Flush()
}

// statusView is what assay rollout status prints.
type statusView struct {
	Routes []store.Route `json:"routes"`
	// History is each route's last statusChanges changes, newest first.
	History []store.RouteChange  `json:"history"`
	Checks  []store.RolloutCheck `json:"checks"`
	Shadow  []comparison         `json:"shadowLastHour"`
}

// statusChanges is how many of each route's last changes status shows.
const statusChanges = 10

func rolloutStatus(ctx context.Context, st *store.Store, reg *contract.Registry, name string, w io.Writer, asJSON bool) error {
	v, err := readStatus(ctx, st, name)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(w).Encode(v)
	}
	printStatus(w, v, reg, name)
	return nil
}

// readStatus reads what rollout status shows of one contract.
func readStatus(ctx context.Context, st *store.Store, name string) (statusView, error) {
	var v statusView
	rs, err := st.Routes(ctx)
	if err != nil {
		return v, err
	}
	for _, r := range rs {
		if r.Contract == name {
			v.Routes = append(v.Routes, r)
		}
	}
	if v.History, err = st.RouteHistory(ctx, name, statusChanges); err != nil {
		return v, err
	}
	if v.Checks, err = st.Checks(ctx, name, 5); err != nil {
		return v, err
	}
	runs, err := st.ShadowRuns(ctx, name, "", time.Now().Add(-time.Hour), 10000)
	if err != nil {
		return v, err
	}
	v.Shadow = compareRuns(runs)
	return v, nil
}

// printStatus writes v as tables: versions, routes and overrides, route
// changes, checks, shadow runs.
func printStatus(w io.Writer, v statusView, reg *contract.Registry, name string) {
	def, _ := reg.Get(name)
	fmt.Fprintf(w, "%s: versions ", name)
	for i, c := range reg.Versions(name) {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprint(w, c.SchemaVersion)
	}
	fmt.Fprintf(w, "; without a route, new work gets %s\n\n", def.SchemaVersion)
	printRoutes(w, v.Routes, reg)
	if len(v.History) > 0 {
		fmt.Fprintln(w, "\nroute changes, newest first:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "AT\tSCOPE\tCHANGE\tFROM\tTO\tCHECK\tBY\tWHY")
		for _, c := range v.History {
			from, to, check := cmp.Or(c.From.Label(), "-"), cmp.Or(c.To.Label(), "-"), "-"
			if c.CheckID != 0 {
				check = fmt.Sprintf("#%d", c.CheckID)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.At.UTC().Format(time.RFC3339), c.Scope, c.Verb, from, to,
				check, c.By, cmp.Or(c.Reason, "-"))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	printRolloutChecks(w, v.Checks)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "shadow runs of the last hour:")
	printComparison(w, v.Shadow)
}

// printRoutes writes the routes' table and a line per override.
func printRoutes(w io.Writer, routes []store.Route, reg *contract.Registry) {
	if len(routes) == 0 {
		fmt.Fprintln(w, "no routes")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tLIVE\tCANDIDATE\tSHADOW SHARE\tUPDATED\tBY")
	for _, r := range routes {
		cand := "-"
		if r.Candidate.Version != "" {
			cand = variantWords(r.Candidate, reg)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f%%\t%s\t%s\n", r.Scope, variantWords(r.Live, reg), cand, 100*r.ShadowShare,
			r.UpdatedAt.UTC().Format(time.RFC3339), r.UpdatedBy)
	}
	tw.Flush()
	for _, r := range routes {
		if o := r.Override; o != nil {
			fmt.Fprintf(w, "OVERRIDE: %s is live for %s without a passed check, by %s at %s: %s\n",
				variantWords(r.Live, reg), scopeWords(r.Scope), o.By, o.At.UTC().Format(time.RFC3339), o.Reason)
		}
	}
}

// printRolloutChecks writes the last rollout checks' table.
func printRolloutChecks(w io.Writer, checks []store.RolloutCheck) {
	if len(checks) == 0 {
		fmt.Fprintln(w, "no rollout checks")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tVERSION\tMODEL\tPROMPT\tTENANT\tSTATE\tSTARTED\tWHY")
	for _, c := range checks {
		var rep checkReport
		_ = json.Unmarshal(c.Report, &rep)
		fmt.Fprintf(tw, "#%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.SchemaVersion, cmp.Or(c.Model, "(cell's)"),
			store.ShortDigest(c.PromptDigest), c.TenantID, c.State, c.StartedAt.UTC().Format(time.RFC3339), strings.Join(rep.Failures, "; "))
	}
	tw.Flush()
}

// rolloutCell is one cell a rollout across cells changes, and its
// database.
type rolloutCell struct{ id, dbURL string }

// cellDatabaseVar is the variable that names a cell's database for a
// rollout across cells: ASSAY_DATABASE_URL_US_2 for us-2.
func cellDatabaseVar(cell string) string {
	return "ASSAY_DATABASE_URL_" + strings.ToUpper(strings.ReplaceAll(cell, "-", "_"))
}

// rolloutCells are the cells --cells or --all-cells names (the cells of
// ASSAY_CELLS, as nats-config spells them, else a cell per region of
// ASSAY_REGIONS), each with its database; a cell without one is refused
// before any cell changes.
func (f *rolloutFlags) rolloutCells() ([]rolloutCell, error) {
	list, from := f.cells, "--cells"
	if f.allCells {
		list, from = envOr("ASSAY_CELLS", envOr("ASSAY_REGIONS", strings.Join(config.DefaultRegions, ","))), "--all-cells"
	}
	own := envOr("ASSAY_CELL", f.region)
	var cells []rolloutCell
	var missing []string
	for _, spec := range strings.Split(list, ",") {
		id, _, _ := strings.Cut(strings.TrimSpace(spec), ":")
		if !event.ValidToken(id) {
			return nil, cli.ConfigError{Err: fmt.Errorf("%s: %q is not a cell id (lower-case letters, digits, hyphens)", from, id)}
		}
		if slices.ContainsFunc(cells, func(c rolloutCell) bool { return c.id == id }) {
			return nil, cli.ConfigError{Err: fmt.Errorf("%s: cell %s is named twice", from, id)}
		}
		c := rolloutCell{id: id, dbURL: os.Getenv(cellDatabaseVar(id))}
		if c.dbURL == "" && id == own {
			c.dbURL = f.dbURL
		}
		if c.dbURL == "" {
			missing = append(missing, cellDatabaseVar(id))
		}
		cells = append(cells, c)
	}
	if len(missing) > 0 {
		return nil, cli.ConfigError{Err: fmt.Errorf("%s: no database for %d of the cells: set %s; nothing was changed",
			from, len(missing), strings.Join(missing, ", "))}
	}
	return cells, nil
}

// inCell runs the verb against one cell's database, behind that cell's
// fence, and returns what it printed.
func (r *rolloutRun) inCell(ctx context.Context, c rolloutCell) (string, error) {
	st, err := store.Open(ctx, c.dbURL)
	if err != nil {
		return "", fmt.Errorf("%s: %w", cellDatabaseVar(c.id), config.RedactError(err, c.dbURL))
	}
	defer st.Close()
	one := *r
	one.st = st
	if r.tenant != "" {
		if err := knownTenant(ctx, st, r.tenant); err != nil {
			return "", err
		}
	}
	var out bytes.Buffer
	switch r.verb {
	case "set-live":
		err = one.setLive(ctx, &out)
	case "set-candidate":
		err = one.setCandidate(ctx, &out)
	case "promote":
		err = one.promote(ctx, &out)
	default:
		err = cli.ConfigError{Err: fmt.Errorf("--cells and --all-cells are for set-live, set-candidate and promote, not %s", r.verb)}
	}
	return out.String(), err
}

// everyCell runs set-live, set-candidate or promote in every cell named,
// each on its own database and behind its own fence. A cell that fails is
// reported and the next is tried; the error names the cells that moved
// and those that did not, a cli.ConfigError (exit 2) when only fences refused.
func (r *rolloutRun) everyCell(ctx context.Context, stdout io.Writer) error {
	cells, err := r.rolloutCells()
	if err != nil {
		return err
	}
	var moved, not []string
	refused := 0
	for _, c := range cells {
		out, err := r.inCell(ctx, c)
		if err != nil {
			fmt.Fprintf(stdout, "cell %s: %v\n", c.id, err)
			not = append(not, c.id)
			if errors.As(err, new(cli.ConfigError)) {
				refused++
			}
			continue
		}
		fmt.Fprintf(stdout, "cell %s: %s", c.id, out)
		moved = append(moved, c.id)
	}
	if len(not) == 0 {
		fmt.Fprintf(stdout, "moved in every cell named: %s\n", strings.Join(moved, ", "))
		return nil
	}
	msg := fmt.Sprintf("rollout %s moved in %d of %d cells: moved in %s; not moved in %s", r.verb, len(moved), len(cells),
		cmp.Or(strings.Join(moved, ", "), "none"), strings.Join(not, ", "))
	if refused > 0 {
		msg += " (each cell is gated by its own last check: run assay rollout check against a cell refused, or move it " +
			"with --override --reason TEXT)"
	}
	if refused == len(not) {
		return cli.ConfigError{Err: errors.New(msg)}
	}
	return errors.New(msg)
}
