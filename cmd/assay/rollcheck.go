package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// checkZ is how many standard errors of the candidate's difference from
// the live variant a usefulness measure may fall short, beyond the slack,
// before a check fails: about a one-sided 2.3% chance of failing a
// candidate exactly as good as live.
const checkZ = 2

// check runs `rollout check`.
func (r *rolloutRun) check(ctx context.Context, stdout io.Writer) error {
	cand, err := r.variant(ctx)
	if err != nil {
		return err
	}
	live := routeOf(ctx, r.st, r.reg, r.tenant, r.name).Live
	chk := checker{st: r.st, reg: r.reg, announce: outbox.Announce(ctx, r.cfg.Names()), tenant: r.tenant, region: r.cfg.Region, timeout: r.timeout,
		samples: r.samples, min: thresholds{Transport: r.minTransport, Structural: r.minStructural, Slack: r.slack, Z: checkZ}}
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

// thresholds are what a check must reach to pass.
type thresholds struct {
	Transport  float64 `json:"minTransport"`
	Structural float64 `json:"minStructural"`
	Slack      float64 `json:"usefulnessSlack"`
	// Z is how many standard errors of the difference a usefulness
	// measure may fall short beyond the slack (checkZ).
	Z float64 `json:"z"`
}

// checkRun is one sample of one evaluation item, asked with one variant.
type checkRun struct {
	Sample     int      `json:"sample"`
	WorkID     string   `json:"workId"`
	State      string   `json:"state"`
	Reason     string   `json:"reason,omitempty"`
	Attempts   []string `json:"attempts"`
	Transport  bool     `json:"transport"`  // the provider answered
	Structural bool     `json:"structural"` // the answer passed the gate
	// Scores are the rubric's measures, in the order of the report's
	// Measures; a run without an accepted answer is scored as its rubric
	// says (evalset.Case.Score).
	Scores []float64 `json:"scores"`
	// Answer is the accepted answer as the rubric reads it
	// (evalset.Scored.Key), "" without one.
	Answer     string `json:"answer,omitempty"`
	CostMicros int64  `json:"costMicros"`
	LatencyMS  int64  `json:"latencyMs"`
}

// stat is one signal's mean over runs and its spread between samples.
type stat struct {
	Signal string  `json:"signal"`
	Mean   float64 `json:"mean"`
	// Spread is the standard deviation between samples of one item: for
	// an item, over its samples (0 with one); in total, the root mean
	// square of the items' spreads.
	Spread float64 `json:"spread"`
}

// checkItem is one evaluation item's samples with one variant.
type checkItem struct {
	Item string `json:"item"`
	// Signals are transport, structural and then the rubric's measures,
	// each over the item's samples.
	Signals []stat `json:"signals"`
	// Unstable says how the samples disagree: "structure" when some passed
	// the gate and others did not, "answer" when accepted answers differ
	// as the rubric reads them; empty when they agree.
	Unstable []string   `json:"unstable,omitempty"`
	Runs     []checkRun `json:"runs"`
}

// signals are a variant's signals over the set, kept apart.
type signals struct {
	Variant    store.Variant `json:"variant"`
	Items      int           `json:"items"`
	Samples    int           `json:"samples"`    // runs of each item
	Transport  float64       `json:"transport"`  // share of runs the provider answered
	Structural float64       `json:"structural"` // share of runs whose answer passed the gate
	// Signals are transport, structural and then the rubric's measures,
	// each over every run of the set.
	Signals []stat `json:"signals"`
	// Unstable counts the items whose samples disagree.
	Unstable   int         `json:"unstable"`
	Calls      int         `json:"calls"`
	CostMicros int64       `json:"costMicros"`
	PerItem    []checkItem `json:"perItem"`
}

// mean is the mean of the signal named name, 0 for none.
func (s signals) mean(name string) float64 {
	for _, st := range s.Signals {
		if st.Signal == name {
			return st.Mean
		}
	}
	return 0
}

// gap is the candidate against the live variant on one usefulness
// measure.
type gap struct {
	Signal    string  `json:"signal"`
	Candidate float64 `json:"candidate"` // mean over the candidate's runs
	Live      float64 `json:"live"`      // mean over the live variant's runs
	// Diff is the mean of the paired differences, candidate minus live,
	// sample k of an item against sample k of the same item; SE is its
	// standard error over the items×samples pairs; Floor, -(slack+z·SE),
	// is the least Diff may be.
	Diff   float64 `json:"diff"`
	SE     float64 `json:"se"`
	Floor  float64 `json:"floor"`
	Passed bool    `json:"passed"`
}

// checkReport is what a rollout check found and decided.
type checkReport struct {
	ID           int64      `json:"id"`
	Contract     string     `json:"contract"`
	Tenant       string     `json:"tenant"`
	PromptDigest string     `json:"promptDigest"`
	StartedAt    time.Time  `json:"startedAt"`
	EndedAt      time.Time  `json:"endedAt"`
	Samples      int        `json:"samples"`
	Measures     []string   `json:"measures"` // the rubric's, in the order runs give them
	Thresholds   thresholds `json:"thresholds"`
	Rule         string     `json:"rule"` // how the verdict is reached, in words
	Candidate    signals    `json:"candidate"`
	Live         signals    `json:"live"`
	Gaps         []gap      `json:"gaps"`
	Passed       bool       `json:"passed"`
	Failures     []string   `json:"failures,omitempty"`
}

// rule says how a check with thresholds t decides.
func (t thresholds) rule() string {
	return fmt.Sprintf("The candidate passes when its transport and structural shares over all runs reach %.2f and %.2f, "+
		"and no usefulness measure's mean paired difference from the live variant (sample k of an item against sample k "+
		"of the same item) is below -(slack %.2f + %g standard errors of that difference over items×samples). "+
		"An item whose samples disagree, on structure or on the answer, is reported unstable; instability does not fail "+
		"a check by itself: structure that flips already costs the structural share, and answers that flip widen the "+
		"spread and lower the mean.", t.Transport, t.Structural, t.Slack, t.Z)
}

type checker struct {
	st       *store.Store
	reg      *contract.Registry
	announce func(*store.Work) ([]store.OutboxMsg, error)
	tenant   string
	region   string
	timeout  time.Duration
	samples  int // runs of each item per variant
	min      thresholds
}

// run records the check, makes the set's work for both variants, each item
// k.samples times, waits for every run's outcome, scores them and records
// the verdict.
func (k *checker) run(ctx context.Context, c *contract.Contract, cand, live store.Variant) (*checkReport, error) {
	set, err := evalset.For(c.Name)
	if err != nil {
		return nil, cli.ConfigError{Err: fmt.Errorf("--contract: %w", err)}
	}
	liveC, ok := k.reg.Of(c.Name, live.Version)
	if !ok {
		return nil, fmt.Errorf("the live route names %s, which this build does not have", live.Version)
	}
	samples := max(k.samples, 1)
	digest := cmp.Or(cand.Prompt, c.PromptDigest)
	rep := &checkReport{Contract: c.Name, Tenant: k.tenant, PromptDigest: digest, StartedAt: time.Now().UTC(),
		Samples: samples, Measures: set.Measures, Thresholds: k.min, Rule: k.min.rule()}
	id, err := k.st.StartCheck(ctx, store.RolloutCheck{Contract: c.Name, SchemaVersion: cand.Version, Model: cand.Model,
		PromptDigest: digest, TenantID: k.tenant})
	if err != nil {
		return nil, err
	}
	rep.ID = id
	of := fmt.Sprintf("check:%d", id)
	deadline := time.Now().Add(k.timeout)
	// made holds, for "candidate" and "live", each item's work ids by
	// sample. Every sample is work of its own: the sample is part of the
	// source id, so the ingress fence neither merges nor supersedes them.
	made := map[string][][]string{}
	var all []string
	for _, side := range []struct {
		name string
		c    *contract.Contract
		v    store.Variant
	}{{"candidate", c, cand}, {"live", liveC, live}} {
		ids := make([][]string, len(set.Cases))
		for n := range samples {
			for i, cs := range set.Cases {
				source := fmt.Sprintf("%s:%s:%d:%s", of, side.name, n, cs.SourceID)
				w := &store.Work{ID: api.WorkID(k.tenant, c.Name, source, cs.Revision), TenantID: k.tenant,
					Region: k.region, Contract: c.Name, SchemaVersion: side.c.SchemaVersion, TaxonomyVersion: side.c.TaxonomyVersion,
					SourceID: source, Revision: cs.Revision, Lane: event.Interactive, Input: string(cs.Input), Digest: api.Digest(cs.Input),
					DeadlineAt: deadline, Model: side.v.Model, PromptDigest: side.v.Prompt, ShadowOf: of}
				ids[i] = append(ids[i], w.ID)
				all = append(all, w.ID)
				if err := k.insert(ctx, w); err != nil {
					k.abandon(ctx, id, err)
					return nil, err
				}
			}
		}
		made[side.name] = ids
	}
	if err := k.wait(ctx, all, deadline.Add(30*time.Second)); err != nil {
		k.abandon(ctx, id, err)
		return nil, err
	}
	got, err := k.st.ShadowRuns(ctx, c.Name, of, rep.StartedAt.Add(-time.Minute), len(all))
	runs := map[string]store.ShadowRun{}
	for _, r := range got {
		runs[r.Work.ID] = r
	}
	if err == nil {
		if rep.Candidate, err = k.score(ctx, cand, set, made["candidate"], runs); err == nil {
			rep.Live, err = k.score(ctx, live, set, made["live"], runs)
		}
	}
	if err != nil {
		k.abandon(ctx, id, err)
		return nil, err
	}
	rep.EndedAt = time.Now().UTC()
	rep.Gaps = gaps(set.Measures, rep.Candidate, rep.Live, k.min)
	rep.Failures = k.failures(rep.Candidate, rep.Gaps)
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

// gaps compares the candidate's runs cs with the live variant's ls on each
// usefulness measure: the mean of the differences of paired runs (sample k
// of an item with each), its standard error over the n = items×samples
// pairs, and whether it stays at or above -(slack + z·SE).
func gaps(measures []string, cs, ls signals, t thresholds) []gap {
	out := make([]gap, 0, len(measures))
	for m, name := range measures {
		var d []float64
		for i, ci := range cs.PerItem {
			for n, r := range ci.Runs {
				d = append(d, r.Scores[m]-ls.PerItem[i].Runs[n].Scores[m])
			}
		}
		mean, sd := meanSD(d)
		g := gap{Signal: name, Candidate: cs.mean(name), Live: ls.mean(name), Diff: mean}
		if len(d) > 0 {
			g.SE = sd / math.Sqrt(float64(len(d)))
		}
		g.Floor = 0 - (t.Slack + t.Z*g.SE) // 0 - x: no slack and no spread give +0, not -0
		// A hair of tolerance keeps rounding in the sums from failing a
		// candidate that answers exactly as live does.
		g.Passed = g.Diff >= g.Floor-1e-9
		out = append(out, g)
	}
	return out
}

// meanSD is the mean of xs and their sample standard deviation (n-1), 0
// for fewer than two.
func meanSD(xs []float64) (mean, sd float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}

// failures are why a candidate with signals cs and gaps gs from the live
// variant fails: each threshold it does not reach; none when it passes.
func (k *checker) failures(cs signals, gs []gap) []string {
	var out []string
	if cs.Transport < k.min.Transport {
		out = append(out, fmt.Sprintf("transport %.1f%% is under %.1f%%", 100*cs.Transport, 100*k.min.Transport))
	}
	if cs.Structural < k.min.Structural {
		out = append(out, fmt.Sprintf("structural acceptance %.1f%% is under %.1f%%", 100*cs.Structural, 100*k.min.Structural))
	}
	for _, g := range gs {
		if !g.Passed {
			out = append(out, fmt.Sprintf("%s %.3f is below the live variant's %.3f by %.3f, more than the %.3f allowed (slack %.3f + %g×SE %.3f)",
				g.Signal, g.Candidate, g.Live, -g.Diff, -g.Floor, k.min.Slack, k.min.Z, g.SE))
		}
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

// wait polls until every work item reached its outcome, or until; an item
// that ended is not read again.
func (k *checker) wait(ctx context.Context, ids []string, until time.Time) error {
	open := slices.Clone(ids)
	for {
		still := open[:0]
		for _, id := range open {
			w, err := k.st.GetWork(ctx, id)
			if err != nil {
				return err
			}
			if !outcome.IsTerminal(w.State) {
				still = append(still, id)
			}
		}
		open = still
		if len(open) == 0 {
			return nil
		}
		if time.Now().After(until) {
			return fmt.Errorf("rollout check: %d of %d work items had no outcome by the timeout; is the cell running?", len(open), len(ids))
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

// score reads one variant's runs back and scores them: transport (the
// provider answered), structural (the gate accepted) and the rubric's
// usefulness measures, per item over its samples and over the set. ids
// holds each item's work ids by sample.
func (k *checker) score(ctx context.Context, v store.Variant, set evalset.Set, ids [][]string, runs map[string]store.ShadowRun) (signals, error) {
	s := signals{Variant: v, Items: len(set.Cases)}
	if len(ids) > 0 {
		s.Samples = len(ids[0])
	}
	names := append([]string{"transport", "structural"}, set.Measures...)
	// variance sums, per signal, the items' variances between samples.
	variance := make([]float64, len(names))
	means := make([]float64, len(names))
	for i, cs := range set.Cases {
		ci := checkItem{Item: cs.Name}
		values := make([][]float64, len(names)) // per signal, by sample
		answers := map[string]bool{}
		structural := 0
		for n, id := range ids[i] {
			run, ok := runs[id]
			if !ok {
				return s, fmt.Errorf("rollout check: %s was not read back", id)
			}
			cr, err := k.readRun(ctx, cs, n, id, run)
			if err != nil {
				return s, err
			}
			s.Calls += run.Calls
			s.CostMicros += run.CostMicros
			if cr.Structural {
				structural++
				answers[cr.Answer] = true
			}
			values[0] = append(values[0], one(cr.Transport))
			values[1] = append(values[1], one(cr.Structural))
			for m, x := range cr.Scores {
				values[2+m] = append(values[2+m], x)
			}
			ci.Runs = append(ci.Runs, cr)
		}
		for j, name := range names {
			mean, sd := meanSD(values[j])
			ci.Signals = append(ci.Signals, stat{Signal: name, Mean: mean, Spread: sd})
			means[j] += mean
			variance[j] += sd * sd
		}
		if structural > 0 && structural < len(ids[i]) {
			ci.Unstable = append(ci.Unstable, "structure")
		}
		if len(answers) > 1 {
			ci.Unstable = append(ci.Unstable, "answer")
		}
		if len(ci.Unstable) > 0 {
			s.Unstable++
		}
		s.PerItem = append(s.PerItem, ci)
	}
	for j, name := range names {
		st := stat{Signal: name, Mean: 1}
		if n := float64(len(set.Cases)); n > 0 {
			// Every item has the same number of samples, so the mean of
			// the items' means is the mean over every run.
			st.Mean, st.Spread = means[j]/n, math.Sqrt(variance[j]/n)
		}
		s.Signals = append(s.Signals, st)
	}
	s.Transport, s.Structural = s.Signals[0].Mean, s.Signals[1].Mean
	return s, nil
}

// readRun reads sample n of an item, work id, back: its attempts, and its
// answer scored by the item's rubric when the work was accepted.
func (k *checker) readRun(ctx context.Context, cs evalset.Case, n int, id string, run store.ShadowRun) (checkRun, error) {
	atts, err := k.st.Attempts(ctx, id)
	if err != nil {
		return checkRun{}, err
	}
	w := run.Work
	cr := checkRun{Sample: n, WorkID: id, State: w.State, Reason: w.Reason, CostMicros: run.CostMicros, LatencyMS: run.LatencyMS}
	for _, a := range atts {
		cr.Attempts = append(cr.Attempts, a.Outcome)
		cr.Transport = cr.Transport || slices.Contains(answered, a.Outcome)
	}
	var answer []byte
	if w.State == outcome.Accepted {
		cr.Structural = true
		answer = run.Output
	}
	sc, err := cs.Score(answer)
	if err != nil {
		return checkRun{}, fmt.Errorf("rollout check: %s: %w", id, err)
	}
	cr.Scores = sc.Values
	if cr.Structural {
		cr.Answer = sc.Key
	}
	return cr, nil
}

// one is 1 for true and 0 for false.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// outcomes says how an item's runs ended, e.g. "accepted 2, schema_rejected 1".
func outcomes(ci checkItem) string {
	var states []string
	count := map[string]int{}
	for _, r := range ci.Runs {
		if count[r.State] == 0 {
			states = append(states, r.State)
		}
		count[r.State]++
	}
	parts := make([]string, 0, len(states))
	for _, st := range states {
		parts = append(parts, fmt.Sprintf("%s %d", st, count[st]))
	}
	return strings.Join(parts, ", ")
}

// meanSpread prints a stat as mean±spread.
func meanSpread(s stat, digits int) string {
	return fmt.Sprintf("%.*f±%.*f", digits, s.Mean, digits, s.Spread)
}

// unstableWords says how an item's samples disagree, "-" when they agree.
func unstableWords(ci checkItem) string {
	if len(ci.Unstable) == 0 {
		return "-"
	}
	return strings.Join(ci.Unstable, ", ")
}

// reportRows are the report's tables as rows of cells, shared by the text
// and the Markdown report: per item, per variant, and the verdict per
// usefulness measure.
func reportRows(r *checkReport) (items, variants, verdict [][]string) {
	head := []string{"ITEM", "OUTCOMES", "TRANSPORT", "STRUCTURAL"}
	for _, m := range r.Measures {
		head = append(head, strings.ToUpper(m))
	}
	for _, m := range r.Measures {
		head = append(head, "LIVE "+strings.ToUpper(m))
	}
	items = append(items, append(head, "UNSTABLE", "LIVE UNSTABLE"))
	for i, c := range r.Candidate.PerItem {
		l := r.Live.PerItem[i]
		row := []string{c.Item, outcomes(c)}
		for _, st := range c.Signals {
			row = append(row, meanSpread(st, 2))
		}
		for _, st := range l.Signals[2:] {
			row = append(row, meanSpread(st, 2))
		}
		items = append(items, append(row, unstableWords(c), unstableWords(l)))
	}
	head = []string{"VARIANT", "TRANSPORT", "STRUCTURAL"}
	for _, m := range r.Measures {
		head = append(head, strings.ToUpper(m))
	}
	variants = append(variants, append(head, "UNSTABLE ITEMS", "CALLS", "COST (µ$)"))
	for _, v := range []struct {
		name string
		s    signals
	}{{"candidate " + r.Candidate.Variant.Label(), r.Candidate}, {"live " + r.Live.Variant.Label(), r.Live}} {
		row := []string{v.name}
		for _, st := range v.s.Signals {
			row = append(row, meanSpread(st, 3))
		}
		variants = append(variants, append(row, fmt.Sprintf("%d of %d", v.s.Unstable, v.s.Items),
			fmt.Sprint(v.s.Calls), fmt.Sprint(v.s.CostMicros)))
	}
	verdict = append(verdict, []string{"MEASURE", "CANDIDATE", "LIVE", "DIFFERENCE", "SE", "FLOOR", "VERDICT"})
	for _, g := range r.Gaps {
		verdict = append(verdict, []string{g.Signal, fmt.Sprintf("%.3f", g.Candidate), fmt.Sprintf("%.3f", g.Live),
			fmt.Sprintf("%+.3f", g.Diff), fmt.Sprintf("%.3f", g.SE), fmt.Sprintf("%+.3f", g.Floor), passWords(g.Passed)})
	}
	return items, variants, verdict
}

func passWords(ok bool) string {
	if ok {
		return "passes"
	}
	return "fails"
}

func printReport(w io.Writer, r *checkReport) {
	fmt.Fprintf(w, "rollout check #%d of %s for tenant %s: %d items, %d samples each per variant (mean±spread between samples)\n\n",
		r.ID, r.Contract, r.Tenant, r.Candidate.Items, r.Samples)
	items, variants, verdict := reportRows(r)
	for i, table := range [][][]string{items, variants, verdict} {
		if i > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, row := range table {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\n%s\n", r.Rule)
	if r.Passed {
		fmt.Fprintf(w, "\npassed\n")
	} else {
		fmt.Fprintf(w, "\nfailed: %s\n", strings.Join(r.Failures, "; "))
	}
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
	fmt.Fprintf(&b, "# Rollout check #%d: %s\n\n%s for tenant %s, %s to %s, %d items with %d samples each per variant. **%s**\n\n",
		r.ID, r.Contract, r.Candidate.Variant.Label(), r.Tenant, r.StartedAt.Format(time.RFC3339), r.EndedAt.Format(time.RFC3339),
		r.Candidate.Items, r.Samples, verdict)
	items, variants, verdictRows := reportRows(r)
	for _, table := range [][][]string{variants, verdictRows, items} {
		for i, row := range table {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
			if i == 0 {
				fmt.Fprintf(&b, "|%s\n", strings.Repeat("---|", len(row)))
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Each cell is mean±spread: the standard deviation between samples of an item, and in total the root mean square of the items'. %s\n", r.Rule)
	if err := os.WriteFile(base+".md", []byte(b.String()), 0o644); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	return []string{base + ".json", base + ".md"}, nil
}
