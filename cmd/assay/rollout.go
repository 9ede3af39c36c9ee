package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

const rolloutUsage = `usage: assay rollout COMMAND [flags]

Versions of a contract side by side: which one new work gets, a candidate
(another version, model or prompt) tried on the evaluation set and in the
shadow of live work, and its promotion.

  check --contract NAME --version V [--model M] [--prompt FILE] --tenant T
        [--out DIR] [--timeout 10m] [--min-transport 1] [--min-structural 1]
        [--usefulness-slack 0]
      run the evaluation set through the cell as shadow work (nothing
      published, no review items, its calls ledgered as shadow and charged
      to T), once with the candidate and once with what T's new work gets
      now; print the three signals per item (transport, structural,
      usefulness) and in total, write rollout-check-ID.json and .md in DIR
      (.), and exit 1 unless the candidate's transport and structural
      shares reach their minimums and its recall and precision are not
      below the live variant's (less the slack)
  set-live --contract NAME --version V [--model M] [--prompt FILE] [--tenant T]
      what new work gets, at once and without a check (a first route, or
      the way back)
  set-candidate --contract NAME --version V [--model M] [--prompt FILE]
        [--share 0.2] [--tenant T]
      the candidate, and the share of live work that also runs with it in
      the shadow (--version none clears it)
  promote --contract NAME [--tenant T]
      the candidate becomes live, only if the last check of exactly its
      version, model and prompt passed
  status --contract NAME [--json]
      routes, the last checks, and the shadow comparison of the last hour
  compare --contract NAME [--since 1h] [--json]
      the candidate's shadow runs against their live work: structural
      failures, agreement of findings, cost and latency

Without --tenant a route is every tenant's ("*"); a tenant's own route
overrides it. Ingress reads routes every ASSAY_ROUTES_EVERY (5s).
`

var rolloutVerbs = []string{"check", "set-live", "set-candidate", "promote", "status", "compare"}

// rolloutTakes are the flags each rollout verb takes, besides --region and
// --database-url.
var rolloutTakes = map[string][]string{
	"check":         {"contract", "version", "model", "prompt", "tenant", "out", "timeout", "min-transport", "min-structural", "usefulness-slack"},
	"set-live":      {"contract", "version", "model", "prompt", "tenant"},
	"set-candidate": {"contract", "version", "model", "prompt", "tenant", "share"},
	"promote":       {"contract", "tenant"},
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
	fs.Float64Var(&f.slack, "usefulness-slack", 0, "check: how far recall and precision may fall below live")
	fs.StringVar(&f.since, "since", "1h", "compare: since")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.StringVar(&f.region, "region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	var err error
	if f.pos, err = parseArgs(fs, args, rolloutUsage); err != nil {
		return nil, err
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	for name := range f.set {
		if !slices.Contains(rolloutTakes[verb], name) && name != "region" && name != "database-url" {
			return nil, configError{fmt.Errorf("--%s is not a flag of rollout %s\n%s", name, verb, rolloutUsage)}
		}
	}
	return f, nil
}

// validate checks the flags against each other and the contracts in reg.
func (f *rolloutFlags) validate(reg *contract.Registry) error {
	switch {
	case len(f.pos) > 0:
		return configError{fmt.Errorf("unexpected argument %q\n%s", f.pos[0], rolloutUsage)}
	case f.name == "":
		return configError{fmt.Errorf("--contract is required\n%s", rolloutUsage)}
	case len(reg.Versions(f.name)) == 0:
		return configError{fmt.Errorf("--contract: %q is not a contract (known: %s)", f.name, strings.Join(reg.Names(), ", "))}
	case slices.Contains(rolloutTakes[f.verb], "version") && f.version == "":
		return configError{fmt.Errorf("--version is required\n%s", rolloutUsage)}
	case f.share < 0 || f.share > 1:
		return configError{fmt.Errorf("--share: %v is not between 0 and 1", f.share)}
	case f.verb == "set-candidate" && f.version != "none" && f.set["share"] == false:
		return configError{errors.New("--share is required: the share of live work that also runs with the candidate (0 for none)")}
	case f.timeout < 10*time.Second:
		return configError{fmt.Errorf("--timeout: %s is less than 10s", f.timeout)}
	case f.minTransport < 0 || f.minTransport > 1 || f.minStructural < 0 || f.minStructural > 1 || f.slack < 0 || f.slack > 1:
		return configError{errors.New("--min-transport, --min-structural and --usefulness-slack are shares between 0 and 1")}
	case f.verb == "check" && f.tenant == "":
		return configError{errors.New("--tenant is required: the tenant the check's calls are charged to")}
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
		return nil, configError{fmt.Errorf("--version: %q is not a version of %s (known: %s)", f.version, f.name, strings.Join(known, ", "))}
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
		return "", configError{fmt.Errorf("--prompt: %w", err)}
	}
	prompt := string(b)
	if strings.TrimSpace(prompt) == "" {
		return "", configError{fmt.Errorf("--prompt: %s is empty", f.promptFile)}
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
		return configError{errors.New(rolloutUsage)}
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
		return configError{fmt.Errorf("--since: %w", err)}
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

// setLive runs `rollout set-live`.
func (r *rolloutRun) setLive(ctx context.Context, stdout io.Writer) error {
	v, err := r.variant(ctx)
	if err != nil {
		return err
	}
	if err := r.st.SetLive(ctx, r.scope, r.name, v, r.by); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s for %s: new work gets %s\n", r.name, scopeWords(r.scope), variantWords(v, r.reg))
	return nil
}

// setCandidate runs `rollout set-candidate`.
func (r *rolloutRun) setCandidate(ctx context.Context, stdout io.Writer) error {
	rt := routeOf(ctx, r.st, r.reg, r.scope, r.name)
	var v store.Variant
	if r.c != nil {
		var err error
		if v, err = r.variant(ctx); err != nil {
			return err
		}
	}
	if err := r.st.SetCandidate(ctx, r.scope, r.name, rt.Live, v, r.share, r.by); err != nil {
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
	rt, check, err := r.st.Promote(ctx, r.scope, r.name, func(v string) string {
		if c, ok := r.reg.Of(r.name, v); ok {
			return c.PromptDigest
		}
		return ""
	}, r.by)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%s for %s has no candidate to promote (assay rollout set-candidate)", r.name, scopeWords(r.scope))
	case errors.Is(err, store.ErrCheckNotPassed):
		return fmt.Errorf("not promoted: %w; run assay rollout check for it", err)
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "%s for %s: new work gets %s (check #%d passed)\n", r.name, scopeWords(r.scope), variantWords(rt.Live, r.reg), check)
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

// check runs `rollout check`.
func (r *rolloutRun) check(ctx context.Context, stdout io.Writer) error {
	cand, err := r.variant(ctx)
	if err != nil {
		return err
	}
	live := routeOf(ctx, r.st, r.reg, r.tenant, r.name).Live
	chk := checker{st: r.st, reg: r.reg, announce: ingress.Announce(ctx, r.cfg.Names()), tenant: r.tenant, region: r.cfg.Region, timeout: r.timeout,
		min: thresholds{Transport: r.minTransport, Structural: r.minStructural, Slack: r.slack}}
	rep, err := chk.run(ctx, r.c, cand, live)
	if err != nil {
		return err
	}
	printReport(stdout, rep)
	paths, err := writeReport(r.out, rep)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "reports: %s\n", strings.Join(paths, ", "))
	if !rep.Passed {
		return fmt.Errorf("rollout check #%d failed: %s", rep.ID, strings.Join(rep.Failures, "; "))
	}
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
	return configError{fmt.Errorf("--tenant: %q is not a tenant of this cell (assay tenant list)", id)}
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

// thresholds are what a check must reach to pass.
type thresholds struct {
	Transport  float64 `json:"minTransport"`
	Structural float64 `json:"minStructural"`
	Slack      float64 `json:"usefulnessSlack"`
}

// checkItem is one evaluation item's run with one variant.
type checkItem struct {
	Item       string   `json:"item"`
	WorkID     string   `json:"workId"`
	State      string   `json:"state"`
	Reason     string   `json:"reason,omitempty"`
	Attempts   []string `json:"attempts"`
	Transport  bool     `json:"transport"`  // the provider answered
	Structural bool     `json:"structural"` // the answer passed the gate
	Expected   int      `json:"expected"`
	Matched    int      `json:"matched"`
	Found      int      `json:"found"`
	Wrong      int      `json:"wrong"`
	Recall     float64  `json:"recall"`
	Precision  float64  `json:"precision"`
	CostMicros int64    `json:"costMicros"`
	LatencyMS  int64    `json:"latencyMs"`
}

// signals are a variant's three signals over the set, kept apart.
type signals struct {
	Variant    store.Variant `json:"variant"`
	Items      int           `json:"items"`
	Transport  float64       `json:"transport"`  // share of items the provider answered
	Structural float64       `json:"structural"` // share of items whose answer passed the gate
	Recall     float64       `json:"recall"`     // expected issues found, over the set
	Precision  float64       `json:"precision"`  // findings that are useful, over the set
	Calls      int           `json:"calls"`
	CostMicros int64         `json:"costMicros"`
	PerItem    []checkItem   `json:"perItem"`
}

// checkReport is what a rollout check found and decided.
type checkReport struct {
	ID           int64      `json:"id"`
	Contract     string     `json:"contract"`
	Tenant       string     `json:"tenant"`
	PromptDigest string     `json:"promptDigest"`
	StartedAt    time.Time  `json:"startedAt"`
	EndedAt      time.Time  `json:"endedAt"`
	Thresholds   thresholds `json:"thresholds"`
	Candidate    signals    `json:"candidate"`
	Live         signals    `json:"live"`
	Passed       bool       `json:"passed"`
	Failures     []string   `json:"failures,omitempty"`
}

type checker struct {
	st       *store.Store
	reg      *contract.Registry
	announce func(*store.Work) ([]store.OutboxMsg, error)
	tenant   string
	region   string
	timeout  time.Duration
	min      thresholds
}

// run records the check, makes the set's work for both variants, waits for
// every item's outcome, scores them and records the verdict.
func (k *checker) run(ctx context.Context, c *contract.Contract, cand, live store.Variant) (*checkReport, error) {
	if c.Grounding != contract.GroundingDiff {
		return nil, configError{fmt.Errorf("--contract: the evaluation set is of code reviews; %s does not review a diff", c.Name)}
	}
	liveC, ok := k.reg.Of(c.Name, live.Version)
	if !ok {
		return nil, fmt.Errorf("the live route names %s, which this build does not have", live.Version)
	}
	digest := cmp.Or(cand.Prompt, c.PromptDigest)
	rep := &checkReport{Contract: c.Name, Tenant: k.tenant, PromptDigest: digest, StartedAt: time.Now().UTC(), Thresholds: k.min}
	id, err := k.st.StartCheck(ctx, store.RolloutCheck{Contract: c.Name, SchemaVersion: cand.Version, Model: cand.Model,
		PromptDigest: digest, TenantID: k.tenant})
	if err != nil {
		return nil, err
	}
	rep.ID = id
	of := fmt.Sprintf("check:%d", id)
	deadline := time.Now().Add(k.timeout)
	items := evalset.Items()
	made := map[string][]string{} // "candidate" and "live": work ids in item order
	for _, side := range []struct {
		name string
		c    *contract.Contract
		v    store.Variant
	}{{"candidate", c, cand}, {"live", liveC, live}} {
		for _, it := range items {
			in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": it.Title})
			source := of + ":" + side.name + ":" + it.SourceID
			w := &store.Work{ID: ingress.WorkID(k.tenant, c.Name, source, it.Revision), TenantID: k.tenant,
				Region: k.region, Contract: c.Name, SchemaVersion: side.c.SchemaVersion, TaxonomyVersion: side.c.TaxonomyVersion,
				SourceID: source, Revision: it.Revision, Lane: event.Interactive, Input: string(in), Digest: ingress.Digest(in),
				DeadlineAt: deadline, Model: side.v.Model, PromptDigest: side.v.Prompt, ShadowOf: of}
			made[side.name] = append(made[side.name], w.ID)
			if err := k.insert(ctx, w); err != nil {
				k.abandon(ctx, id, err)
				return nil, err
			}
		}
	}
	if err := k.wait(ctx, append(slices.Clone(made["candidate"]), made["live"]...), deadline.Add(30*time.Second)); err != nil {
		k.abandon(ctx, id, err)
		return nil, err
	}
	got, err := k.st.ShadowRuns(ctx, c.Name, of, rep.StartedAt.Add(-time.Minute), 2*len(items))
	runs := map[string]store.ShadowRun{}
	for _, r := range got {
		runs[r.Work.ID] = r
	}
	if err == nil {
		if rep.Candidate, err = k.score(ctx, cand, items, made["candidate"], runs); err == nil {
			rep.Live, err = k.score(ctx, live, items, made["live"], runs)
		}
	}
	if err != nil {
		k.abandon(ctx, id, err)
		return nil, err
	}
	rep.EndedAt = time.Now().UTC()
	rep.Failures = k.failures(rep.Candidate, rep.Live)
	rep.Passed = len(rep.Failures) == 0
	raw, err := json.Marshal(rep)
	if err != nil {
		return nil, err
	}
	if err := k.st.EndCheck(ctx, id, rep.Passed, raw); err != nil {
		return nil, err
	}
	return rep, nil
}

// failures are why a candidate with signals cs fails beside the live
// variant's ls: each threshold it does not reach; none when it passes.
func (k *checker) failures(cs, ls signals) []string {
	var out []string
	if cs.Transport < k.min.Transport {
		out = append(out, fmt.Sprintf("transport %.1f%% is under %.1f%%", 100*cs.Transport, 100*k.min.Transport))
	}
	if cs.Structural < k.min.Structural {
		out = append(out, fmt.Sprintf("structural acceptance %.1f%% is under %.1f%%", 100*cs.Structural, 100*k.min.Structural))
	}
	if cs.Recall < ls.Recall-k.min.Slack {
		out = append(out, fmt.Sprintf("recall %.3f is below the live variant's %.3f", cs.Recall, ls.Recall))
	}
	if cs.Precision < ls.Precision-k.min.Slack {
		out = append(out, fmt.Sprintf("precision %.3f is below the live variant's %.3f", cs.Precision, ls.Precision))
	}
	return out
}

// abandon records a check that could not finish as failed, with why.
func (k *checker) abandon(ctx context.Context, id int64, cause error) {
	raw, _ := json.Marshal(map[string]string{"error": cause.Error()})
	_ = k.st.EndCheck(context.WithoutCancel(ctx), id, false, raw)
}

func (k *checker) insert(ctx context.Context, w *store.Work) error {
	if _, _, err := k.st.InsertWork(ctx, w, k.announce); err != nil {
		return fmt.Errorf("rollout check: %s: %w", w.SourceID, err)
	}
	return nil
}

// wait polls until every work item reached its outcome, or until.
func (k *checker) wait(ctx context.Context, ids []string, until time.Time) error {
	for {
		open := 0
		for _, id := range ids {
			w, err := k.st.GetWork(ctx, id)
			if err != nil {
				return err
			}
			if !outcome.IsTerminal(w.State) {
				open++
			}
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(until) {
			return fmt.Errorf("rollout check: %d of %d work items had no outcome by the timeout; is the cell running?", open, len(ids))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// answered are the attempt outcomes of a call the provider answered.
var answered = []string{outcome.AttemptOK, outcome.AttemptInvalidOutput, outcome.AttemptRefused,
	outcome.AttemptContentFiltered, outcome.AttemptTruncated, outcome.AttemptToolCall}

// score reads one variant's items back and scores them: transport (the
// provider answered), structural (the gate accepted) and usefulness (the
// rubric, an item without an accepted answer scored as finding nothing).
func (k *checker) score(ctx context.Context, v store.Variant, items []evalset.Item, ids []string, runs map[string]store.ShadowRun) (signals, error) {
	s := signals{Variant: v, Items: len(items)}
	var scores []evalset.Score
	transport, structural := 0, 0
	for i, id := range ids {
		run, ok := runs[id]
		if !ok {
			return s, fmt.Errorf("rollout check: %s was not read back", id)
		}
		atts, err := k.st.Attempts(ctx, id)
		if err != nil {
			return s, err
		}
		w := run.Work
		ci := checkItem{Item: items[i].Name, WorkID: id, State: w.State, Reason: w.Reason,
			CostMicros: run.CostMicros, LatencyMS: run.LatencyMS}
		s.Calls += run.Calls
		s.CostMicros += run.CostMicros
		for _, a := range atts {
			ci.Attempts = append(ci.Attempts, a.Outcome)
			ci.Transport = ci.Transport || slices.Contains(answered, a.Outcome)
		}
		var fs []evalset.Finding
		if w.State == outcome.Accepted {
			ci.Structural = true
			if fs, err = evalset.Findings(run.Output); err != nil {
				return s, err
			}
		}
		sc := evalset.ScoreItem(items[i], fs)
		scores = append(scores, sc)
		ci.Expected, ci.Matched, ci.Found, ci.Wrong, ci.Recall, ci.Precision = sc.Expected, sc.Matched, sc.Found, sc.Wrong, sc.Recall, sc.Precision
		if ci.Transport {
			transport++
		}
		if ci.Structural {
			structural++
		}
		s.PerItem = append(s.PerItem, ci)
	}
	t := evalset.Totals(scores)
	s.Transport, s.Structural = ratio(transport, len(ids)), ratio(structural, len(ids))
	s.Recall, s.Precision = t.Recall, t.Precision
	return s, nil
}

func ratio(n, d int) float64 {
	if d == 0 {
		return 1
	}
	return float64(n) / float64(d)
}

func printReport(w io.Writer, r *checkReport) {
	fmt.Fprintf(w, "rollout check #%d of %s for tenant %s\n\n", r.ID, r.Contract, r.Tenant)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tCANDIDATE\tTRANSPORT\tSTRUCTURAL\tFOUND\tRECALL\tPRECISION\tLIVE RECALL\tLIVE PRECISION")
	for i, c := range r.Candidate.PerItem {
		l := r.Live.PerItem[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d of %d\t%.2f\t%.2f\t%.2f\t%.2f\n", c.Item, c.State, yes(c.Transport), yes(c.Structural),
			c.Matched, c.Expected, c.Recall, c.Precision, l.Recall, l.Precision)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIANT\tTRANSPORT\tSTRUCTURAL\tRECALL\tPRECISION")
	for _, s := range []struct {
		name string
		s    signals
	}{{"candidate " + r.Candidate.Variant.Label(), r.Candidate}, {"live " + r.Live.Variant.Label(), r.Live}} {
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f%%\t%.3f\t%.3f\n", s.name, 100*s.s.Transport, 100*s.s.Structural, s.s.Recall, s.s.Precision)
	}
	tw.Flush()
	if r.Passed {
		fmt.Fprintf(w, "\npassed\n")
	} else {
		fmt.Fprintf(w, "\nfailed: %s\n", strings.Join(r.Failures, "; "))
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// writeReport writes the report as JSON and as Markdown into dir.
func writeReport(dir string, r *checkReport) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	base := filepath.Join(dir, fmt.Sprintf("rollout-check-%d", r.ID))
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".json", append(raw, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	var b strings.Builder
	verdict := "passed"
	if !r.Passed {
		verdict = "failed: " + strings.Join(r.Failures, "; ")
	}
	fmt.Fprintf(&b, "# Rollout check #%d: %s\n\n%s for tenant %s, %s to %s. **%s**\n\n", r.ID, r.Contract,
		r.Candidate.Variant.Label(), r.Tenant, r.StartedAt.Format(time.RFC3339), r.EndedAt.Format(time.RFC3339), verdict)
	fmt.Fprintf(&b, "| Variant | Transport | Structural | Recall | Precision | Calls | Cost (µ$) |\n|---|---|---|---|---|---|---|\n")
	for _, s := range []struct {
		name string
		s    signals
	}{{"candidate " + r.Candidate.Variant.Label(), r.Candidate}, {"live " + r.Live.Variant.Label(), r.Live}} {
		fmt.Fprintf(&b, "| %s | %.1f%% | %.1f%% | %.3f | %.3f | %d | %d |\n", s.name, 100*s.s.Transport, 100*s.s.Structural,
			s.s.Recall, s.s.Precision, s.s.Calls, s.s.CostMicros)
	}
	fmt.Fprintf(&b, "\n| Item | Outcome | Transport | Structural | Found | Recall | Precision | Live recall | Live precision |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, c := range r.Candidate.PerItem {
		l := r.Live.PerItem[i]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d of %d | %.2f | %.2f | %.2f | %.2f |\n", c.Item, c.State, yes(c.Transport),
			yes(c.Structural), c.Matched, c.Expected, c.Recall, c.Precision, l.Recall, l.Precision)
	}
	if err := os.WriteFile(base+".md", []byte(b.String()), 0o644); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	return []string{base + ".json", base + ".md"}, nil
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
	Routes []store.Route        `json:"routes"`
	Checks []store.RolloutCheck `json:"checks"`
	Shadow []comparison         `json:"shadowLastHour"`
}

func rolloutStatus(ctx context.Context, st *store.Store, reg *contract.Registry, name string, w io.Writer, asJSON bool) error {
	var v statusView
	rs, err := st.Routes(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.Contract == name {
			v.Routes = append(v.Routes, r)
		}
	}
	if v.Checks, err = st.Checks(ctx, name, 5); err != nil {
		return err
	}
	runs, err := st.ShadowRuns(ctx, name, "", time.Now().Add(-time.Hour), 10000)
	if err != nil {
		return err
	}
	v.Shadow = compareRuns(runs)
	if asJSON {
		return json.NewEncoder(w).Encode(v)
	}
	def, _ := reg.Get(name)
	fmt.Fprintf(w, "%s: versions ", name)
	for i, c := range reg.Versions(name) {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprint(w, c.SchemaVersion)
	}
	fmt.Fprintf(w, "; without a route, new work gets %s\n\n", def.SchemaVersion)
	if len(v.Routes) == 0 {
		fmt.Fprintln(w, "no routes")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tLIVE\tCANDIDATE\tSHADOW SHARE\tUPDATED\tBY")
		for _, r := range v.Routes {
			cand := "-"
			if r.Candidate.Version != "" {
				cand = variantWords(r.Candidate, reg)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f%%\t%s\t%s\n", r.Scope, variantWords(r.Live, reg), cand, 100*r.ShadowShare,
				r.UpdatedAt.UTC().Format(time.RFC3339), r.UpdatedBy)
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	if len(v.Checks) == 0 {
		fmt.Fprintln(w, "no rollout checks")
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHECK\tVERSION\tMODEL\tPROMPT\tTENANT\tSTATE\tSTARTED\tWHY")
		for _, c := range v.Checks {
			var rep checkReport
			_ = json.Unmarshal(c.Report, &rep)
			fmt.Fprintf(tw, "#%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.SchemaVersion, cmp.Or(c.Model, "(cell's)"),
				store.ShortDigest(c.PromptDigest), c.TenantID, c.State, c.StartedAt.UTC().Format(time.RFC3339), strings.Join(rep.Failures, "; "))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "shadow runs of the last hour:")
	printComparison(w, v.Shadow)
	return nil
}
