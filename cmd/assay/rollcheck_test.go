package main

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/schemas"
)

// promptWith writes the prompt file of schemas/prompts with a directive
// the simulated provider obeys, as a candidate prompt file.
func promptWith(t *testing.T, file, directive string) string {
	t.Helper()
	base, err := schemas.FS.ReadFile("prompts/" + file)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "prompt.txt")
	if err := os.WriteFile(p, append(base, []byte("\n"+directive+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A candidate model whose answers are noisy (it drops each finding with
// probability 0.3, drawn anew per call) is checked twice with one sample
// and twice with eight, each pair under two seeds of the provider's draws.
// With one sample the verdict depends on the draw: one seed passes it and
// another fails it. With eight, the same two seeds agree: both fail it,
// since its recall is truly lower than live's, and the report calls its
// items unstable while the live variant's are stable.
func TestRolloutCheckSamplesSteadyVerdict(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	dir := t.TempDir()
	check := func(seed uint64, samples int) checkReport {
		t.Helper()
		b.Sim.Reseed(seed)
		out, err := rollout(t, b, "check", "--contract", "code-review", "--version", "code-review/1", "--model", sim.NoisyModel(30),
			"--tenant", "acme", "--out", dir, "--samples", strconv.Itoa(samples))
		r := readReport(t, dir, out)
		if (err == nil) != r.Passed || r.Samples != samples || r.Candidate.Transport != 1 || r.Candidate.Structural != 1 {
			t.Fatalf("seed %d, %d samples: error %v, report passed %v, samples %d, transport %.2f, structural %.2f\n%s",
				seed, samples, err, r.Passed, r.Samples, r.Candidate.Transport, r.Candidate.Structural, out)
		}
		t.Logf("seed %d, %d samples: passed %v, recall %.3f against %.3f, diff %+.3f, floor %+.3f; %d unstable items",
			seed, samples, r.Passed, r.Gaps[0].Candidate, r.Gaps[0].Live, r.Gaps[0].Diff, r.Gaps[0].Floor, r.Candidate.Unstable)
		return r
	}
	// One sample: look for a seed the candidate passes with and one it
	// fails with; the draws are the same for a seed on every run.
	var passes, fails uint64
	for seed := uint64(1); seed <= 10 && (passes == 0 || fails == 0); seed++ {
		if check(seed, 1).Passed {
			passes = cmpZero(passes, seed)
		} else {
			fails = cmpZero(fails, seed)
		}
	}
	if passes == 0 || fails == 0 {
		t.Fatalf("with one sample, seeds 1 to 10 gave one verdict only (a pass with seed %d, a failure with seed %d)", passes, fails)
	}

	for _, seed := range []uint64{passes, fails} {
		r := check(seed, 8)
		if r.Passed || len(r.Failures) != 1 || !strings.HasPrefix(r.Failures[0], "recall ") {
			t.Errorf("seed %d, 8 samples: passed %v, failures %q; want a failure on recall alone", seed, r.Passed, r.Failures)
		}
		if r.Candidate.Unstable < 5 || r.Live.Unstable != 0 {
			t.Errorf("seed %d, 8 samples: %d unstable candidate items, %d live; want several and none", seed, r.Candidate.Unstable, r.Live.Unstable)
		}
		spread := false
		for i, ci := range r.Candidate.PerItem {
			if len(ci.Runs) != 8 || len(r.Live.PerItem[i].Runs) != 8 {
				t.Fatalf("%s: %d candidate and %d live runs, want 8 each", ci.Item, len(ci.Runs), len(r.Live.PerItem[i].Runs))
			}
			if slices.Contains(ci.Unstable, "answer") && ci.Signals[2].Spread > 0 {
				spread = true
			}
			if slices.Contains(ci.Unstable, "structure") {
				t.Errorf("%s: structure flips, yet every answer passed the gate", ci.Item)
			}
		}
		if !spread || r.Candidate.Signals[2].Spread == 0 || r.Live.Signals[2].Spread != 0 {
			t.Errorf("seed %d: no spread of recall reported for the candidate's unstable items, or some for live: %+v, %+v",
				seed, r.Candidate.Signals, r.Live.Signals)
		}
	}
	if n := b.Count(t, `SELECT count(DISTINCT source_id) FROM work WHERE shadow_of IS NOT NULL`); n < 2*2*8*len(evalset.Items()) {
		t.Errorf("%d distinct sources of check work; each sample must be work of its own", n)
	}
}

// cmpZero is have, or v when have is 0.
func cmpZero(have, v uint64) uint64 {
	if have == 0 {
		return v
	}
	return have
}

// Every contract has an evaluation set that rollout check runs as work of
// that contract: the simulated reviewer passes (its samples agree), a
// candidate whose answers break the schema fails on structure, and one
// that finds nothing fails on its set's usefulness measures.
func TestRolloutCheckEveryContract(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	dir := t.TempDir()
	for _, tc := range []struct {
		contract, version, prompt string
		measures                  []string
		empty                     string // the directive that finds nothing
		emptyFails                string // the measure that catches it
	}{
		{"code-review", "code-review/2", "code-review-2.txt", []string{"recall", "precision"}, sim.DirectiveNoFindings, "recall"},
		{"change-review", "change-review/1", "change-review.txt", []string{"tags", "severity"}, sim.DirectiveNoFindings, "severity"},
		{"moderation", "moderation/1", "moderation.txt", []string{"category", "human-review"}, sim.DirectiveFlagNothing, "category"},
	} {
		t.Run(tc.contract, func(t *testing.T) {
			set, err := evalset.For(tc.contract)
			if err != nil {
				t.Fatal(err)
			}
			check := func(args ...string) (checkReport, string, error) {
				t.Helper()
				out, err := rollout(t, b, append([]string{"check", "--contract", tc.contract, "--version", tc.version,
					"--tenant", "acme", "--out", dir, "--samples", "2"}, args...)...)
				return readReport(t, dir, out), out, err
			}

			good, out, err := check()
			if err != nil || !good.Passed {
				t.Fatalf("the simulated reviewer: %v\n%s", err, out)
			}
			if !slices.Equal(good.Measures, tc.measures) || good.Candidate.Items != len(set.Cases) || good.Samples != 2 ||
				good.Candidate.Structural != 1 || good.Live.Structural != 1 || good.Candidate.Unstable != 0 || good.Live.Unstable != 0 {
				t.Fatalf("the simulated reviewer's report: measures %v, %d items, %d samples, structural %.2f/%.2f, unstable %d/%d",
					good.Measures, good.Candidate.Items, good.Samples, good.Candidate.Structural, good.Live.Structural,
					good.Candidate.Unstable, good.Live.Unstable)
			}
			for _, m := range tc.measures {
				if c, l := good.Candidate.mean(m), good.Live.mean(m); c != l || l < 0.5 {
					t.Errorf("%s: candidate %.3f, live %.3f; want equal and at least 0.5", m, c, l)
				}
			}
			md, err := os.ReadFile(filepath.Join(dir, "rollout-check-"+strconv.FormatInt(good.ID, 10)+".md"))
			if err != nil || !strings.Contains(string(md), "±") || !strings.Contains(string(md), "standard errors") {
				t.Errorf("the Markdown report gives no spread or no rule: %v\n%s", err, md)
			}
			if !strings.Contains(out, "mean±spread") || !strings.Contains(out, strings.ToUpper(tc.measures[1])) {
				t.Errorf("the printed report:\n%s", out)
			}

			broken, out, err := check("--prompt", promptWith(t, tc.prompt, sim.DirectiveAddNotes))
			if err == nil || broken.Passed || broken.Candidate.Structural != 0 || broken.Candidate.Transport != 1 ||
				!strings.Contains(err.Error(), "structural acceptance 0.0% is under 100.0%") {
				t.Fatalf("a candidate that breaks the schema: %v\n%s", err, out)
			}

			empty, out, err := check("--prompt", promptWith(t, tc.prompt, tc.empty))
			if err == nil || empty.Passed || empty.Candidate.Structural != 1 || !strings.Contains(err.Error(), tc.emptyFails+" ") {
				t.Fatalf("a candidate that finds nothing: %v\n%s", err, out)
			}
			for _, g := range empty.Gaps {
				if g.Signal == tc.emptyFails && (g.Passed || g.Diff >= g.Floor) {
					t.Errorf("%s: %+v passes", g.Signal, g)
				}
			}
		})
	}
	// The check's work carried each contract's own input.
	for contract, field := range map[string]string{"code-review": "diff", "change-review": "diff", "moderation": "text"} {
		if n := b.Count(t, `SELECT count(*) FROM work WHERE contract = $1 AND shadow_of LIKE 'check:%' AND NOT (input::jsonb ? $2)`,
			contract, field); n != 0 {
			t.Errorf("%d %s check work items without %q in their input", n, contract, field)
		}
	}
}

// The verdict on a usefulness measure, decided from the paired runs alone:
// the same answers pass, a steady small loss within the slack passes, a
// loss the spread explains passes (a single flip, or a loss on one item of
// four that sixteen pairs cannot tell from noise), and a loss on every
// item fails.
func TestCheckGaps(t *testing.T) {
	side := func(items ...[]float64) signals {
		var s signals
		var all []float64
		for i, samples := range items {
			ci := checkItem{Item: strconv.Itoa(i)}
			for n, x := range samples {
				ci.Runs = append(ci.Runs, checkRun{Sample: n, Scores: []float64{x}})
				all = append(all, x)
			}
			s.PerItem = append(s.PerItem, ci)
		}
		m, _ := meanSD(all)
		s.Signals = []stat{{Signal: "recall", Mean: m}}
		return s
	}
	live := side([]float64{1, 1, 1, 1}, []float64{1, 1, 1, 1}, []float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1})
	for _, tc := range []struct {
		name  string
		cand  signals
		slack float64
		pass  bool
	}{
		{"the same answers", live, 0, true},
		{"a steady loss within the slack", side([]float64{0.9, 0.9, 0.9, 0.9}, []float64{1, 1, 1, 1}, []float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1}), 0.05, true},
		{"a steady loss beyond it", side([]float64{0.8, 0.8, 0.8, 0.8}, []float64{0.8, 0.8, 0.8, 0.8}, []float64{0.3, 0.3, 0.3, 0.3}, []float64{0.8, 0.8, 0.8, 0.8}), 0.05, false},
		{"a loss on one item of four", side([]float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1}, []float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1}), 0.05, true},
		{"one flip the spread explains", side([]float64{1, 0, 1, 1}, []float64{1, 1, 1, 1}, []float64{0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1}), 0, true},
		{"a loss on every item", side([]float64{1, 0, 0, 1}, []float64{0, 1, 0, 1}, []float64{0, 0.5, 0, 0.5}, []float64{0, 0, 1, 1}), 0, false},
	} {
		g := gaps([]string{"recall"}, tc.cand, live, thresholds{Slack: tc.slack, Z: checkZ})[0]
		if g.Passed != tc.pass || g.Floor > -tc.slack {
			t.Errorf("%s: %+v, want passed %v", tc.name, g, tc.pass)
		}
	}
	if m, sd := meanSD([]float64{1, 0}); m != 0.5 || sd != math.Sqrt(0.5) {
		t.Errorf("meanSD(1, 0) = %v, %v", m, sd)
	}
	if m, sd := meanSD([]float64{0.25}); m != 0.25 || sd != 0 {
		t.Errorf("meanSD(0.25) = %v, %v", m, sd)
	}
}

// --samples is a check's flag, 3 unless given, between 1 and 20.
func TestRolloutCheckSamplesFlag(t *testing.T) {
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		verb string
		args []string
		want int    // the samples taken, when valid
		err  string // what the error names, when not
	}{
		{"check", nil, 3, ""},
		{"check", []string{"--samples", "20"}, 20, ""},
		{"check", []string{"--samples", "0"}, 0, "--samples: 0 is not between 1 and 20"},
		{"check", []string{"--samples", "21"}, 0, "--samples: 21 is not between 1 and 20"},
		{"set-live", []string{"--samples", "2"}, 0, "--samples is not a flag of rollout set-live"},
	} {
		args := append([]string{"--contract", "moderation", "--version", "moderation/1", "--tenant", "acme"}, tc.args...)
		f, err := parseRolloutFlags(tc.verb, args)
		if err == nil {
			err = f.validate(reg)
		}
		var cerr cli.ConfigError
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s %v: %v", tc.verb, tc.args, err)
		case tc.err == "" && f.samples != tc.want:
			t.Errorf("%s %v: samples %d, want %d", tc.verb, tc.args, f.samples, tc.want)
		case tc.err != "" && (!errors.As(err, &cerr) || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %v: %v, want a usage error naming %q", tc.verb, tc.args, err, tc.err)
		}
	}
}
