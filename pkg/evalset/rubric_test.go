package evalset_test

import (
	"fmt"
	"slices"
	"testing"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
)

// Every expected and acceptable range lies on lines the diff adds, in a
// file it changes; clean items expect nothing and the others something.
func TestExpectedFindingsAreChangedLines(t *testing.T) {
	for _, it := range evalset.Items() {
		d, err := diff.Parse(it.Diff)
		if err != nil {
			t.Fatal(err)
		}
		added := func(file string, from, to int) error {
			f := d.File(file)
			if f == nil {
				return fmt.Errorf("file %s is not in the diff", file)
			}
			lines := map[int]bool{}
			for _, l := range f.Added() {
				lines[l.NewLine] = true
			}
			for n := from; n <= to; n++ {
				if !lines[n] {
					return fmt.Errorf("%s:%d is not an added line", file, n)
				}
			}
			return nil
		}
		clean := slices.Contains(evalset.Clean, it.Name)
		if clean != (len(it.Expect) == 0) {
			t.Errorf("%s: clean %v with %d expected findings", it.Name, clean, len(it.Expect))
		}
		for _, e := range it.Expect {
			if err := added(e.File, e.From, e.To); err != nil {
				t.Errorf("%s: expected %q: %v", it.Name, e.Reason, err)
			}
			if !slices.Contains(evalset.Categories, e.Category) {
				t.Errorf("%s: category %q", it.Name, e.Category)
			}
		}
		for _, x := range it.Extras {
			if err := added(x.File, x.From, x.To); err != nil {
				t.Errorf("%s: acceptable %q: %v", it.Name, x.Reason, err)
			}
		}
	}
}

func TestScoreItem(t *testing.T) {
	it := evalset.Item{Name: "x",
		Expect: []evalset.Expect{{File: "a.go", From: 10, To: 12, Category: "money"}, {File: "b.go", From: 3, To: 3, Category: "security"}},
		Extras: []evalset.Extra{{File: "a.go", From: 20, To: 20}},
	}
	cases := []struct {
		name                        string
		fs                          []evalset.Finding
		matched, acceptable, wrong  int
		recall, precision           float64
		categoryAgree, categoryKnow int
	}{
		{"nothing found", nil, 0, 0, 0, 0, 1, 0, 0},
		{"all found", []evalset.Finding{{"a.go", 12, "money"}, {"b.go", 3, "correctness"}}, 2, 0, 0, 1, 1, 1, 2},
		{"range ends count", []evalset.Finding{{"a.go", 10, ""}, {"a.go", 13, ""}}, 1, 0, 1, 0.5, 0.5, 0, 0},
		{"same issue twice, an extra, a wrong file", []evalset.Finding{{"a.go", 11, ""}, {"a.go", 11, ""}, {"a.go", 20, ""}, {"c.go", 3, ""}}, 1, 1, 1, 0.5, 0.75, 0, 0},
		{"line of another file's issue", []evalset.Finding{{"a.go", 3, "security"}}, 0, 0, 1, 0, 0, 0, 0},
	}
	for _, tc := range cases {
		s := evalset.ScoreItem(it, tc.fs)
		if s.Matched != tc.matched || s.Acceptable != tc.acceptable || s.Wrong != tc.wrong ||
			s.Recall != tc.recall || s.Precision != tc.precision || s.CategoryAgree != tc.categoryAgree || s.CategoryKnown != tc.categoryKnow {
			t.Errorf("%s: %+v", tc.name, s)
		}
		if len(s.Missed) != s.Expected-s.Matched {
			t.Errorf("%s: missed %v", tc.name, s.Missed)
		}
	}
	clean := evalset.ScoreItem(evalset.Item{Name: "clean"}, nil)
	if clean.Recall != 1 || clean.Precision != 1 {
		t.Errorf("clean item, empty review: %+v", clean)
	}
	tot := evalset.Totals([]evalset.Score{
		evalset.ScoreItem(it, []evalset.Finding{{"a.go", 12, "money"}}),
		evalset.ScoreItem(evalset.Item{Name: "clean"}, []evalset.Finding{{"z.go", 1, ""}}),
	})
	if tot.Expected != 2 || tot.Matched != 1 || tot.Found != 2 || tot.Useful != 1 || tot.Recall != 0.5 || tot.Precision != 0.5 {
		t.Errorf("totals %+v", tot)
	}
}

func TestFindings(t *testing.T) {
	fs, err := evalset.Findings([]byte(`{"schemaVersion":2,"changeId":"w","findings":[{"file":"a.go","line":4,"category":"money","evidence":"x"}]}`))
	if err != nil || len(fs) != 1 || fs[0] != (evalset.Finding{File: "a.go", Line: 4, Category: "money"}) {
		t.Fatalf("%v %v", fs, err)
	}
	for _, bad := range []string{`{"findings":null}`, `{}`, `[]`, `{"findings":[{"line":"4"}]}`, `not json`} {
		if _, err := evalset.Findings([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
