package evalset_test

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
)

var (
	hexRe    = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sourceRe = regexp.MustCompile(`^[\w.-]+/[\w.-]+#[0-9]+$`)
)

func TestItemsParseAndLookReal(t *testing.T) {
	items := evalset.Items()
	if len(items) < 10 {
		t.Fatalf("%d items, want at least 10", len(items))
	}
	if !slices.IsSortedFunc(items, func(a, b evalset.Item) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("items not in name order")
	}
	again := evalset.Items()
	exts := map[string]bool{}
	for i, it := range items {
		if !reflect.DeepEqual(it, again[i]) {
			t.Errorf("%s: Items() not deterministic", it.Name)
		}
		if it.Title == "" || !sourceRe.MatchString(it.SourceID) || !hexRe.MatchString(it.Revision) {
			t.Errorf("%s: bad metadata %q %q %q", it.Name, it.Title, it.SourceID, it.Revision)
		}
		if !strings.HasPrefix(it.Diff, "diff --git ") {
			t.Errorf("%s: not in git format", it.Name)
		}
		if n := strings.Count(strings.TrimRight(it.Diff, "\n"), "\n") + 1; n < 15 || n > 60 {
			t.Errorf("%s: %d lines, want 15-60", it.Name, n)
		}
		d, err := diff.Parse(it.Diff)
		if err != nil {
			t.Errorf("%s: %v", it.Name, err)
			continue
		}
		for _, f := range d.Files {
			if len(f.Hunks) == 0 || len(f.Added()) == 0 {
				t.Errorf("%s: %s has no added lines", it.Name, f.Path)
			}
			exts[f.Path[strings.LastIndex(f.Path, ".")+1:]] = true
		}
	}
	for _, e := range []string{"go", "ts", "py"} {
		if !exts[e] {
			t.Errorf("no .%s file in the set", e)
		}
	}
	seen := map[string]bool{}
	for _, it := range items {
		if seen[it.Revision] {
			t.Errorf("%s: duplicate revision", it.Name)
		}
		seen[it.Revision] = true
	}
}
