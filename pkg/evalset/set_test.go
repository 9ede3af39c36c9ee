package evalset_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
)

// Every contract has a set of at least ten cases, each with an input of
// the contract's shape, a distinct source and revision, and a rubric with
// one value per measure that scores a missing answer.
func TestEveryContractHasASet(t *testing.T) {
	input := map[string][]string{"code-review": {"diff", "title"}, "change-review": {"diff", "title"}, "moderation": {"text"}}
	for name, fields := range input {
		s, err := evalset.For(name)
		if err != nil {
			t.Fatal(err)
		}
		if s.Contract != name || len(s.Measures) != 2 || len(s.Cases) < 10 {
			t.Fatalf("%s: %q with measures %v and %d cases", name, s.Contract, s.Measures, len(s.Cases))
		}
		seen := map[string]bool{}
		for _, c := range s.Cases {
			var in map[string]string
			if err := json.Unmarshal(c.Input, &in); err != nil {
				t.Fatalf("%s %s: input %v", name, c.Name, err)
			}
			for _, f := range fields {
				if _, ok := in[f]; !ok || len(in) != len(fields) {
					t.Errorf("%s %s: input %v, want fields %v", name, c.Name, in, fields)
				}
			}
			if !hexRe.MatchString(c.Revision) || !sourceRe.MatchString(c.SourceID) || seen[c.SourceID] || seen[c.Revision] {
				t.Errorf("%s %s: source %q, revision %q", name, c.Name, c.SourceID, c.Revision)
			}
			seen[c.SourceID], seen[c.Revision] = true, true
			sc, err := c.Score(nil)
			if err != nil || len(sc.Values) != len(s.Measures) || sc.Key != "" {
				t.Errorf("%s %s: no answer scored %+v, %v", name, c.Name, sc, err)
			}
		}
	}
	if _, err := evalset.For("translation"); !errors.Is(err, evalset.ErrNoSet) {
		t.Errorf("unknown contract: %v", err)
	}
}

// The change-review set's diffs parse, every changed file adds lines, and
// together they expect every tag and every severity.
func TestChangesParse(t *testing.T) {
	tags, sevs := map[string]bool{}, map[string]bool{}
	for _, c := range evalset.Changes() {
		if c.Title == "" || c.Reason == "" || !strings.HasPrefix(c.Diff, "diff --git ") {
			t.Errorf("%s: %+v", c.Name, c)
		}
		d, err := diff.Parse(c.Diff)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for _, f := range d.Files {
			if len(f.Added()) == 0 {
				t.Errorf("%s: %s adds nothing", c.Name, f.Path)
			}
		}
		for _, tag := range c.Tags {
			tags[tag] = true
		}
		sevs[c.Severity] = true
	}
	for _, tag := range evalset.ChangeTags {
		if !tags[tag] {
			t.Errorf("no change expects tag %s", tag)
		}
	}
	for _, s := range evalset.Severities {
		if !sevs[s] {
			t.Errorf("no change expects severity %s", s)
		}
	}
}

// The moderation set has every category, and a human looks at each
// self-harm text.
func TestPostsParse(t *testing.T) {
	cats := map[string]int{}
	for _, p := range evalset.Posts() {
		cats[p.Category]++
		if p.Category == "self_harm" && !p.NeedsHumanReview {
			t.Errorf("%s: self-harm without human review", p.Name)
		}
	}
	for _, c := range evalset.ModerationCategories {
		if cats[c] < 2 {
			t.Errorf("%d texts of category %s, want at least 2", cats[c], c)
		}
	}
}

func TestScoreChange(t *testing.T) {
	c := evalset.Change{Name: "c", Tags: []string{"data-access", "rollback"}, Severity: "high"}
	for _, tc := range []struct {
		name           string
		a              *evalset.ChangeAnswer
		tags, severity float64
	}{
		{"no answer", nil, 0, 0},
		{"exact", &evalset.ChangeAnswer{Severity: "high", Tags: []string{"rollback", "data-access"}}, 1, 1},
		{"one tag missing", &evalset.ChangeAnswer{Severity: "high", Tags: []string{"data-access"}}, 2.0 / 3, 1},
		{"one tag extra, repeated", &evalset.ChangeAnswer{Severity: "low", Tags: []string{"data-access", "rollback", "auth", "auth"}}, 0.8, 0},
		{"wrong tag", &evalset.ChangeAnswer{Severity: "medium", Tags: []string{"payments"}}, 0, 0},
	} {
		s := evalset.ScoreChange(c, tc.a)
		if s.Tags != tc.tags || s.Severity != tc.severity {
			t.Errorf("%s: %+v, want tags %.3f severity %.0f", tc.name, s, tc.tags, tc.severity)
		}
	}
}

func TestScorePost(t *testing.T) {
	p := evalset.Post{Name: "p", Category: "self_harm", NeedsHumanReview: true}
	for _, tc := range []struct {
		name                 string
		v                    *evalset.Verdict
		category, humanCheck float64
	}{
		{"no answer", nil, 0, 0},
		{"right", &evalset.Verdict{Category: "self_harm", NeedsHumanReview: true}, 1, 1},
		{"human review only", &evalset.Verdict{Category: "other", NeedsHumanReview: true}, 0, 1},
		{"harmless", &evalset.Verdict{Category: "other"}, 0, 0},
	} {
		s := evalset.ScorePost(p, tc.v)
		if s.Category != tc.category || s.HumanReview != tc.humanCheck {
			t.Errorf("%s: %+v", tc.name, s)
		}
	}
}

// A case's key tells answers apart as its rubric reads them: the same
// findings in another order, or with other summaries, are the same answer.
func TestScoredKey(t *testing.T) {
	key := func(contract string, answer string) string {
		t.Helper()
		s, err := evalset.For(contract)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := s.Cases[0].Score([]byte(answer))
		if err != nil {
			t.Fatal(err)
		}
		return sc.Key
	}
	a := key("code-review", `{"findings":[{"file":"a.go","line":3,"summary":"x"},{"file":"b.go","line":1}]}`)
	b := key("code-review", `{"findings":[{"file":"b.go","line":1},{"file":"a.go","line":3,"summary":"y"}]}`)
	c := key("code-review", `{"findings":[{"file":"a.go","line":3}]}`)
	if a != b || a == c {
		t.Errorf("code-review keys %q, %q, %q", a, b, c)
	}
	a = key("change-review", `{"severity":"high","tags":["auth","payments"],"findings":[{"code":"X","summary":"s"}]}`)
	b = key("change-review", `{"severity":"high","tags":["payments","auth"],"findings":[{"code":"X","summary":"t"}]}`)
	c = key("change-review", `{"severity":"medium","tags":["payments","auth"],"findings":[{"code":"X"}]}`)
	if a != b || a == c {
		t.Errorf("change-review keys %q, %q, %q", a, b, c)
	}
	a = key("moderation", `{"category":"spam","confidence":0.6,"needsHumanReview":true}`)
	b = key("moderation", `{"category":"spam","confidence":0.9,"needsHumanReview":true}`)
	c = key("moderation", `{"category":"spam","confidence":0.9,"needsHumanReview":false}`)
	if a != b || a == c || a != "spam|true" {
		t.Errorf("moderation keys %q, %q, %q", a, b, c)
	}
}
