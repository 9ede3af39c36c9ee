package diff

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// bigDiff is a change to files source, test, doc, vendored and lock files
// alike, each with hunks of a few lines.
func bigDiff(files int) string {
	var b strings.Builder
	paths := []string{"svc/handler%d.go", "svc/handler%d_test.go", "docs/guide%d.md", "vendor/lib%d/x.go", "web/app%d.ts"}
	for i := range files {
		p := fmt.Sprintf(paths[i%len(paths)], i)
		if i == 7 {
			p = "go.sum"
		}
		fmt.Fprintf(&b, "diff --git a/%s b/%s\nindex 1111111..2222222 100644\n--- a/%s\n+++ b/%s\n", p, p, p, p)
		for h := range 3 {
			start := 10 + h*40
			fmt.Fprintf(&b, "@@ -%d,4 +%d,5 @@ func f%d() {\n", start, start+h, h)
			fmt.Fprintf(&b, " \tctx := context.Background()\n-\told(%d, %d)\n+\tnext(%d, %d)\n+\tcheck(%d)\n \treturn nil\n \t}\n", i, h, i, h, i)
		}
	}
	return b.String()
}

// line is one diff line with where it belongs, to compare a split with
// its whole.
type line struct {
	Path    string
	Kind    byte
	Text    string
	NewLine int
}

func linesOf(t *testing.T, d *Diff, skip map[string]bool) []line {
	t.Helper()
	var out []line
	for _, f := range d.Files {
		if skip[f.Path] {
			continue
		}
		for _, h := range f.Hunks {
			for _, l := range h.Lines {
				out = append(out, line{f.Path, l.Kind, l.Text, l.NewLine})
			}
		}
	}
	return out
}

func TestSplitSmallDiffIsOnePart(t *testing.T) {
	d, err := Parse(gitTwoFiles)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Split(d, 10000, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Parts) != 1 || plan.Parts[0].ID != "p1" || !reflect.DeepEqual(plan.Parts[0].Files, []string{"cart/total.go", "web/price.ts"}) {
		t.Fatalf("parts = %+v, want one part p1 with both files", plan.Parts)
	}
	back, err := Parse(plan.Parts[0].Text)
	if err != nil {
		t.Fatalf("the part does not parse: %v\n%s", err, plan.Parts[0].Text)
	}
	if got, want := linesOf(t, back, nil), linesOf(t, d, nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("the part's lines differ from the diff's:\n got %v\nwant %v", got, want)
	}
	if !strings.HasPrefix(plan.Parts[0].Text, "diff --git a/cart/total.go b/cart/total.go\nindex 3b18e51..a1c2d3f 100644\n") {
		t.Fatalf("the part lost the file's header:\n%s", plan.Parts[0].Text)
	}
}

func TestSplitCoversEveryLineOnceRiskiestFirst(t *testing.T) {
	text := bigDiff(40)
	d, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 300
	plan, err := Split(d, budget, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Parts) < 5 {
		t.Fatalf("%d parts for a %d-byte diff at %d units of 4 bytes; want it cut", len(plan.Parts), len(text), budget)
	}
	if !reflect.DeepEqual(plan.Skipped, []Skipped{{Path: "go.sum", Reason: "lock file"}}) {
		t.Fatalf("skipped = %+v, want go.sum as a lock file", plan.Skipped)
	}
	var got []line
	rank := 0
	for i, p := range plan.Parts {
		if p.ID != fmt.Sprintf("p%d", i+1) || len(p.Digest) != 12 {
			t.Fatalf("part %d is named %q (digest %q)", i, p.ID, p.Digest)
		}
		if p.Units > budget || p.Units != Units(p.Text, 4) {
			t.Fatalf("part %s has %d units (counted %d), budget %d", p.ID, p.Units, Units(p.Text, 4), budget)
		}
		if p.Rank < rank {
			t.Fatalf("part %s has rank %d after rank %d", p.ID, p.Rank, rank)
		}
		rank = p.Rank
		back, err := Parse(p.Text)
		if err != nil {
			t.Fatalf("part %s does not parse: %v\n%s", p.ID, err, p.Text)
		}
		var paths []string
		for _, f := range back.Files {
			paths = append(paths, f.Path)
			if r, _ := Risk(f.Path); r < p.Rank {
				t.Fatalf("part %s of rank %d holds %s of rank %d", p.ID, p.Rank, f.Path, r)
			}
		}
		if !reflect.DeepEqual(paths, p.Files) {
			t.Fatalf("part %s says it holds %v; its text holds %v", p.ID, p.Files, paths)
		}
		got = append(got, linesOf(t, back, nil)...)
	}
	want := linesOf(t, d, map[string]bool{"go.sum": true})
	if len(got) != len(want) {
		t.Fatalf("the parts hold %d lines, the diff %d", len(got), len(want))
	}
	seen := map[line]int{}
	for _, l := range got {
		seen[l]++
	}
	for _, l := range want {
		if seen[l] != 1 {
			t.Fatalf("line %+v is in %d parts, want 1", l, seen[l])
		}
	}
	if first := plan.Parts[0].Files[0]; first != "svc/handler0.go" {
		t.Fatalf("first file reviewed is %s, want the first source file", first)
	}
	if last := plan.Parts[len(plan.Parts)-1]; last.Rank != 3 {
		t.Fatalf("last part has rank %d, want vendored files last", last.Rank)
	}
	again, _ := Split(d, budget, 4)
	if !reflect.DeepEqual(plan, again) {
		t.Fatal("the same diff and budget gave other parts")
	}
}

func TestSplitCutsAHunkTooLargeForOnePart(t *testing.T) {
	var b strings.Builder
	b.WriteString("diff --git a/big.go b/big.go\n--- a/big.go\n+++ b/big.go\n@@ -5,80 +5,160 @@ func big() {\n")
	for i := range 200 {
		switch i % 5 {
		case 0:
			fmt.Fprintf(&b, " \tkeep(%d)\n", i)
		case 1:
			fmt.Fprintf(&b, "-\tgone(%d)\n", i)
		default:
			fmt.Fprintf(&b, "+\tnew(%d)\n", i)
		}
	}
	d, err := Parse(b.String())
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Split(d, 200, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Parts) < 4 {
		t.Fatalf("%d parts, want the hunk cut in several", len(plan.Parts))
	}
	var got []line
	for _, p := range plan.Parts {
		if p.Units > 200 {
			t.Fatalf("part %s has %d units", p.ID, p.Units)
		}
		if !strings.HasPrefix(p.Text, "diff --git a/big.go b/big.go\n--- a/big.go\n+++ b/big.go\n@@ ") {
			t.Fatalf("part %s does not start with the file's header:\n%s", p.ID, p.Text)
		}
		back, err := Parse(p.Text)
		if err != nil {
			t.Fatalf("part %s does not parse: %v\n%s", p.ID, err, p.Text)
		}
		got = append(got, linesOf(t, back, nil)...)
	}
	if want := linesOf(t, d, nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("the pieces' lines (numbers included) differ from the hunk's")
	}
}

func TestSplitRefusesNoBudget(t *testing.T) {
	d, _ := Parse(gitTwoFiles)
	if _, err := Split(d, 0, 4); err == nil {
		t.Fatal("a budget of 0 was taken")
	}
}

func TestRisk(t *testing.T) {
	for path, want := range map[string]int{
		"cmd/app/main.go": 0, "src/lib.rs": 0, "pkg/x/x_test.go": 1, "web/a.spec.ts": 1, "tests/unit/a.py": 1,
		"pkg/x/testdata/in.json": 1, "test_models.py": 1, "README.md": 2, "docs/arch/x.go": 2,
		"vendor/github.com/a/b.go": 3, "api/v1/x.pb.go": 3, "static/app.min.js": 3, "pkg/zz_generated.deepcopy.go": 3,
	} {
		if got, skip := Risk(path); got != want || skip != "" {
			t.Errorf("Risk(%s) = %d %q, want %d", path, got, skip, want)
		}
	}
	for _, path := range []string{"go.sum", "web/package-lock.json", "Cargo.lock", "a/b/yarn.lock", "flake.lock"} {
		if _, skip := Risk(path); skip != "lock file" {
			t.Errorf("Risk(%s) skipped %q, want lock file", path, skip)
		}
	}
}

func TestSplitLineOverTheBudgetIsAPartAlone(t *testing.T) {
	long := strings.Repeat("x", 2000)
	text := "--- a/a.go\n+++ b/a.go\n@@ -1,2 +1,4 @@\n keep()\n+" + long + "\n+short()\n keep()\n"
	d, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Split(d, 100, 4)
	if err != nil {
		t.Fatal(err)
	}
	var over int
	for _, p := range plan.Parts {
		if p.Units > 100 {
			over++
			if !strings.Contains(p.Text, "+"+long+"\n") {
				t.Fatalf("part %s is over the budget without the long line", p.ID)
			}
		}
	}
	if over != 1 {
		t.Fatalf("%d parts over the budget, want the long line's alone: %+v", over, plan.Parts)
	}
}
