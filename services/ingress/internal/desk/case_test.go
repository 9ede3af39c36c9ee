package desk

import (
	"testing"

	"assay.dev/pkg/diff"
)

const caseDiff = `diff --git a/cart.go b/cart.go
--- a/cart.go
+++ b/cart.go
@@ -10,3 +10,4 @@ func total()
 a := 1
+b := 2
 c := 3
 d := 4
`

// Each finding of an answer is placed where the diff shows it: on a line
// of a hunk, in a file of the diff but outside its hunks, or not in the
// diff at all; an answer that is not JSON places nothing.
func TestPlaceFindings(t *testing.T) {
	t.Parallel()
	d, err := diff.Parse(caseDiff)
	if err != nil {
		t.Fatal(err)
	}
	answer := []byte(`{"findings":[{"file":"cart.go","line":11},{"file":"cart.go","line":40},{"file":"other.go","line":1},{"title":"no place"}]}`)
	got := placeFindings(answer, d)
	want := []struct {
		file   string
		line   int
		placed string
	}{{"cart.go", 11, "line"}, {"cart.go", 40, "outside_hunk"}, {"other.go", 1, "not_in_diff"}, {"", 0, "not_in_diff"}}
	if len(got) != len(want) {
		t.Fatalf("%d findings placed, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if g := got[i]; g.Index != i || g.File != w.file || g.Line != w.line || g.Placed != w.placed {
			t.Errorf("finding %d: %+v, want %s:%d %s", i, g, w.file, w.line, w.placed)
		}
	}
	if got := placeFindings([]byte(`not json`), d); len(got) != 0 {
		t.Errorf("an answer that is not JSON placed %+v", got)
	}
	if files := caseFiles(d); len(files) != 1 || len(files[0].Hunks) != 1 || files[0].Hunks[0].Header != "@@ -10,3 +10,4 @@ func total()" ||
		len(files[0].Hunks[0].Lines) != 4 {
		t.Errorf("case files %+v", files)
	}
}

// A review item's id is its work's, and nothing else is taken for one.
func TestParseReviewID(t *testing.T) {
	t.Parallel()
	const hex = "0123456789abcdef01234567"
	if id, ok := parseReviewID("rv_" + hex); !ok || id != "w_"+hex {
		t.Errorf("rv_%s: %q %v", hex, id, ok)
	}
	for _, bad := range []string{"w_" + hex, "rv_", "rv_" + hex + "0", "rv_XYZ", "rv_../" + hex, ""} {
		if _, ok := parseReviewID(bad); ok {
			t.Errorf("%q taken for a review item's id", bad)
		}
	}
}
