package classifier

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// finding is a code-review finding as the gate hands it on: its line a
// json.Number.
func finding(file string, line int, sev, summary, evidence string) map[string]any {
	return map[string]any{"file": file, "line": json.Number(strings.TrimSpace(jsonInt(line))), "severity": sev,
		"summary": summary, "evidence": evidence}
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

// categorised is a finding of code-review 2, with a category and a
// confidence.
func categorised(file string, line int, sev, category, confidence, summary, evidence string) map[string]any {
	f := finding(file, line, sev, summary, evidence)
	f["category"], f["confidence"] = category, json.Number(confidence)
	return f
}

func mergedJSON(t *testing.T, parts [][]any) (string, int) {
	t.Helper()
	out, folded := mergeFindings(parts)
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), folded
}

// Two parts that show the same lines word one issue differently: one
// finding, at the more severe one's line, with its summary, the higher
// confidence and both evidence lines.
func TestMergeRewordedDuplicates(t *testing.T) {
	t.Parallel()
	a := categorised("svc/orders.go", 12, "warning", "security", "0.7",
		"SQL query built by string concatenation; use a parameterized query",
		`q := "SELECT * FROM orders WHERE id = " + id`)
	b := categorised("svc/orders.go", 13, "blocking", "security", "0.9",
		"The query is built by concatenating strings into SQL: use parameterized queries instead",
		`rows, err := db.Query(q)`)
	out, folded := mergeFindings([][]any{{a}, {b}})
	if len(out) != 1 || folded != 1 {
		t.Fatalf("merged into %d findings, folded %d; want 1 and 1: %v", len(out), folded, out)
	}
	m := out[0].(map[string]any)
	if m["severity"] != "blocking" || m["line"] != json.Number("13") || m["summary"] != b["summary"] ||
		m["confidence"] != json.Number("0.9") || m["evidence"] != b["evidence"].(string)+"\n"+a["evidence"].(string) {
		t.Fatalf("merged %v; want b's severity, line and summary, confidence 0.9 and both evidence lines", m)
	}
	// Without categories the severity is what must agree.
	c := finding("svc/orders.go", 40, "warning", "Error returned by Close is ignored", "defer f.Close()")
	d := finding("svc/orders.go", 41, "warning", "the error Close returns is never checked, it is ignored", "defer f.Close()")
	if out, folded := mergeFindings([][]any{{c}, {d}}); len(out) != 1 || folded != 1 ||
		out[0].(map[string]any)["evidence"] != "defer f.Close()" {
		t.Fatalf("merged %v, folded %d; want one finding with the one evidence once", out, folded)
	}
}

// Merging is the same whatever order the parts, and their findings, come
// in.
func TestMergeIsOrderIndependent(t *testing.T) {
	t.Parallel()
	p1 := []any{
		finding("a.go", 10, "blocking", "SQL built by string concatenation", "x + id"),
		finding("a.go", 30, "info", "unused variable count", "count := 0"),
	}
	p2 := []any{
		finding("a.go", 11, "blocking", "string concatenation builds the SQL", "db.Query(x)"),
		finding("b.go", 5, "warning", "error from Write is ignored", "w.Write(b)"),
	}
	p3 := []any{
		finding("a.go", 12, "blocking", "SQL query is built by concatenating strings", "rows.Next()"),
		finding("a.go", 31, "info", "the variable count is unused", "count := 0"),
	}
	want, folded := mergedJSON(t, [][]any{p1, p2, p3})
	if folded != 3 {
		t.Fatalf("folded %d, want 3: %s", folded, want)
	}
	parts := [][]any{p1, p2, p3}
	for _, perm := range [][]int{{0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
		var in [][]any
		for _, i := range perm {
			fs := slices.Clone(parts[i])
			slices.Reverse(fs)
			in = append(in, fs)
		}
		if got, _ := mergedJSON(t, in); got != want {
			t.Errorf("parts in order %v merged to\n%s\nwant\n%s", perm, got, want)
		}
	}
}

// Findings that only look alike stay apart: another issue on the next
// line, the same words too far away or in another file, another category,
// or two findings of one part.
func TestMergeKeepsNearMissesApart(t *testing.T) {
	t.Parallel()
	sql := "SQL query built by string concatenation; use a parameterized query"
	reworded := "The query is built by concatenating strings into SQL: use parameterized queries instead"
	for name, pair := range map[string][2]map[string]any{
		"another issue on the next line": {finding("a.go", 12, "warning", sql, "q"),
			finding("a.go", 13, "warning", "the error returned by step is ignored", "step(1, 2)")},
		"same words, lines apart": {finding("a.go", 12, "warning", sql, "q"),
			finding("a.go", 12+mergeLines+1, "warning", sql, "q")},
		"same words, another file": {finding("a.go", 12, "warning", sql, "q"),
			finding("b.go", 12, "warning", sql, "q")},
		"reworded, another severity": {finding("a.go", 12, "warning", sql, "q"),
			finding("a.go", 13, "blocking", reworded, "q")},
		"reworded, another category": {categorised("a.go", 12, "warning", "security", "0.8", sql, "q"),
			categorised("a.go", 13, "warning", "maintainability", "0.8", reworded, "q")},
		"close and write": {finding("a.go", 12, "warning", "the error returned by Close is ignored", "x"),
			finding("a.go", 13, "warning", "the error returned by Write is ignored, data may be lost", "y")},
	} {
		if out, folded := mergeFindings([][]any{{pair[0]}, {pair[1]}}); len(out) != 2 || folded != 0 {
			t.Errorf("%s: merged into %v", name, out)
		}
	}
	one := []any{finding("a.go", 12, "warning", sql, "q"), finding("a.go", 13, "warning", reworded, "r")}
	if out, _ := mergeFindings([][]any{one}); len(out) != 2 {
		t.Errorf("two findings of one part merged into %v", out)
	}
}

// The measure: the word sets of summaries that say the same thing overlap
// at least mergeSimilarity, those of different issues less.
func TestSummarySimilarity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"SQL query built by string concatenation; use a parameterized query",
			"The query is built by concatenating strings into SQL: use parameterized queries instead", true},
		{"Possible nil pointer dereference of cfg", "cfg may be nil here and is dereferenced", true},
		{"Division by zero when count is 0", "count may be zero, causing a division by zero", true},
		{"SQL query built by string concatenation", "the error returned by step is ignored", false},
		{"the error returned by Close is ignored", "the error returned by Write is ignored, data may be lost", false},
	} {
		j := jaccard(summaryWords(c.a), summaryWords(c.b))
		if (j >= mergeSimilarity) != c.same {
			t.Errorf("%q and %q: similarity %.2f (words %v and %v), same issue %v", c.a, c.b, j,
				summaryWords(c.a), summaryWords(c.b), c.same)
		}
	}
}
