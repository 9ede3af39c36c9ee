package classifier

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"unicode"
)

// Findings of a review in parts are merged when they point at the same
// issue: a model words one issue differently from two parts that both
// show its lines. Two findings are the same issue when
//
//   - they name the same file,
//   - their lines are at most mergeLines apart,
//   - they have the same category (a contract whose findings carry one),
//     or else the same severity, and
//   - their summaries say the same thing: the Jaccard similarity of their
//     word sets — lower-cased words, common English words left out, each
//     cut to its stem — is at least mergeSimilarity;
//
// and findings of one part are merged only when file, line and summary are
// all the same (a model that reports two issues on adjacent lines of one
// part meant two). Being the same issue is taken transitively, so the
// findings fall into groups whatever order they came in; each group
// becomes one finding: the most severe of it (the first in file, line and
// content order among equals), with the highest confidence of the group and
// the evidence of every member, each once, one per line, as far as the
// schema's evidence length allows.

const (
	// mergeLines is how many lines apart two findings may be and still
	// point at one issue.
	mergeLines = 3
	// mergeSimilarity is the word-set similarity at which two summaries
	// say the same thing.
	mergeSimilarity = 0.5
	// evidenceMax is the longest evidence the code-review schemas take.
	evidenceMax = 1000
)

// partFinding is one finding of one part, with what merging compares.
type partFinding struct {
	part  int
	m     map[string]any
	file  string
	line  int64
	sev   int
	key   string // the finding as canonical JSON: the order among equals
	words map[string]bool
}

// mergeFindings merges the findings of parts (each part's findings, in any
// order) into one list, ordered by file, line, severity (most severe
// first) and content, and says how many findings were folded into another.
func mergeFindings(parts [][]any) (out []any, folded int) {
	var fs []partFinding
	for i, part := range parts {
		for _, f := range part {
			m, _ := f.(map[string]any) // the schema makes every finding an object
			key, _ := json.Marshal(m)
			file, _ := m["file"].(string)
			summary, _ := m["summary"].(string)
			fs = append(fs, partFinding{part: i, m: m, file: file, line: lineNumber(m["line"]), sev: severity(m),
				key: string(key), words: summaryWords(summary)})
		}
	}
	slices.SortFunc(fs, func(a, b partFinding) int {
		return cmp.Or(cmp.Compare(a.file, b.file), cmp.Compare(a.line, b.line), cmp.Compare(b.sev, a.sev), cmp.Compare(a.key, b.key))
	})
	groups := groupFindings(fs)
	for _, g := range groups {
		out = append(out, mergeGroup(fs, g))
	}
	return out, len(fs) - len(groups)
}

// groupFindings groups fs (sorted by file and line) into the sets that
// point at one issue, each a list of indexes into fs in order, the groups
// in the order of their first member.
func groupFindings(fs []partFinding) [][]int {
	parent := make([]int, len(fs))
	for i := range parent {
		parent[i] = i
	}
	var root func(int) int
	root = func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	for i := range fs {
		for j := i + 1; j < len(fs) && fs[j].file == fs[i].file && fs[j].line-fs[i].line <= mergeLines; j++ {
			if sameIssue(&fs[i], &fs[j]) {
				a, b := root(i), root(j)
				parent[max(a, b)] = min(a, b)
			}
		}
	}
	var groups [][]int
	at := map[int]int{}
	for i := range fs {
		r := root(i)
		g, ok := at[r]
		if !ok {
			g = len(groups)
			at[r] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// sameIssue says whether a and b, of one file and at most mergeLines
// apart, point at one issue.
func sameIssue(a, b *partFinding) bool {
	if a.line == b.line && a.m["summary"] == b.m["summary"] {
		return true
	}
	if a.part == b.part {
		return false
	}
	ca, hasA := a.m["category"]
	cb, hasB := b.m["category"]
	if hasA || hasB {
		if ca != cb {
			return false
		}
	} else if a.sev != b.sev {
		return false
	}
	return jaccard(a.words, b.words) >= mergeSimilarity
}

// mergeGroup is the one finding the group g of fs becomes.
func mergeGroup(fs []partFinding, g []int) map[string]any {
	best := g[0]
	for _, i := range g[1:] {
		if fs[i].sev > fs[best].sev {
			best = i
		}
	}
	out := make(map[string]any, len(fs[best].m))
	for k, v := range fs[best].m {
		out[k] = v
	}
	if len(g) == 1 {
		return out
	}
	order := append([]int{best}, slices.DeleteFunc(slices.Clone(g), func(i int) bool { return i == best })...)
	var evidence []string
	size := -1
	for _, i := range order {
		ev, _ := fs[i].m["evidence"].(string)
		if ev == "" || slices.Contains(evidence, ev) || size+1+len(ev) > evidenceMax {
			continue
		}
		evidence = append(evidence, ev)
		size += 1 + len(ev)
	}
	out["evidence"] = strings.Join(evidence, "\n")
	if c, ok := maxConfidence(fs, g); ok {
		out["confidence"] = c
	}
	return out
}

// maxConfidence is the highest confidence among the group's findings, as
// written by the most confident; false when they carry none.
func maxConfidence(fs []partFinding, g []int) (json.Number, bool) {
	var best json.Number
	top := math.Inf(-1)
	for _, i := range g {
		n, ok := fs[i].m["confidence"].(json.Number)
		if !ok {
			continue
		}
		if v, err := n.Float64(); err == nil && v > top {
			best, top = n, v
		}
	}
	return best, best != ""
}

// lineNumber reads a finding's line (a json.Number once the gate has
// normalised the answer); 0 when it is not one.
func lineNumber(v any) int64 {
	switch n := v.(type) {
	case json.Number:
		i, _ := n.Int64()
		return i
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
}

// jaccard is |a ∩ b| / |a ∪ b|, 0 for two empty sets.
func jaccard(a, b map[string]bool) float64 {
	both := 0
	for w := range a {
		if b[w] {
			both++
		}
	}
	union := len(a) + len(b) - both
	if union == 0 {
		return 0
	}
	return float64(both) / float64(union)
}

// summaryWords is the set of a summary's words as merging compares them:
// lower-cased, split at anything but letters and digits, common English
// words left out, each cut to its stem.
func summaryWords(s string) map[string]bool {
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if !stopWords[w] {
			words[stem(w)] = true
		}
	}
	return words
}

// stopWords are words that say nothing of which issue a summary means.
var stopWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an the of to in on at by for with from into onto is are was were be been being
		it its this that these those and or as so if then than here there which who whose can could may might should
		would will shall must also instead very just any some such has have had do does did`) {
		m[w] = true
	}
	return m
}()

// stemSuffixes are cut from a word's end, the first that fits, leaving at
// least three letters, and replaced: concatenation and concatenating both
// become concatenat, queries query.
var stemSuffixes = []struct{ cut, put string }{{"izations", "iz"}, {"ization", "iz"}, {"ations", "at"}, {"ation", "at"},
	{"ions", ""}, {"ion", ""}, {"ings", ""}, {"ing", ""}, {"ies", "y"}, {"ied", "y"}, {"ers", ""}, {"er", ""}, {"ed", ""},
	{"ly", ""}, {"es", ""}, {"s", ""}}

// stem cuts a word to a stem its inflections share, and a last e of what
// is left.
func stem(w string) string {
	for _, s := range stemSuffixes {
		if len(w)-len(s.cut) >= 3 && strings.HasSuffix(w, s.cut) {
			w = w[:len(w)-len(s.cut)] + s.put
			break
		}
	}
	if len(w) > 3 && strings.HasSuffix(w, "e") {
		w = w[:len(w)-1]
	}
	return w
}
