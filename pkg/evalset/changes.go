// The change-review set
//
// changes/*.diff are twelve changes of a shop's code and schema, each with
// the risk a careful approver would see in it, kept in changes.json: the
// change-review contract's tags (its closed set: auth, data-access,
// payments, rollback) and its overall severity (low, medium, high), with a
// sentence saying why. An answer is scored on two measures:
//
//   - tags: the F1 of its tags against the expected ones, 2·|both| over
//     |answered|+|expected|, so a missing tag and an extra tag both cost;
//   - severity: 1 when its severity is the expected one, else 0.
//
// An item without an accepted answer scores 0 on both.

package evalset

import (
	"bytes"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

//go:embed changes/*.diff
var changeFiles embed.FS

// changesJSON maps each change's name to its title, origin and expected
// answer.
//
//go:embed changes.json
var changesJSON []byte

// ChangeTags and Severities are the change-review contract's closed sets.
var (
	ChangeTags = []string{"auth", "data-access", "payments", "rollback"}
	Severities = []string{"low", "medium", "high"}
)

// Change is one item of the change-review set.
type Change struct {
	Name     string // file name without ".diff", e.g. "02-drop-phone-column"
	Title    string
	Diff     string
	SourceID string // owner/repo#number
	Revision string // 40 hex digits derived from the diff
	// Tags are the risk areas a correct answer tags, in ChangeTags order;
	// Severity is its overall severity; Reason says why in one sentence.
	Tags     []string
	Severity string
	Reason   string
}

type rawChange struct {
	Title    string   `json:"title"`
	Source   string   `json:"source"`
	Tags     []string `json:"tags"`
	Severity string   `json:"severity"`
	Reason   string   `json:"reason"`
}

// Changes returns the change-review set in file-name order. It panics if
// the embedded diffs and changes.json disagree (an item without an entry,
// an entry without a diff, a tag or severity outside the contract's sets,
// a missing title, origin or reason), which tests guard against.
func Changes() []Change {
	paths, err := fs.Glob(changeFiles, "changes/*.diff")
	if err != nil {
		panic(err)
	}
	slices.Sort(paths)
	var raw map[string]rawChange
	dec := json.NewDecoder(bytes.NewReader(changesJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		panic(fmt.Errorf("evalset: changes.json: %w", err))
	}
	if len(raw) != len(paths) {
		panic(fmt.Sprintf("evalset: changes.json has %d entries for %d diffs", len(raw), len(paths)))
	}
	out := make([]Change, 0, len(paths))
	for _, p := range paths {
		name := strings.TrimSuffix(path.Base(p), ".diff")
		r, ok := raw[name]
		if !ok {
			panic("evalset: changes.json has no entry for " + name)
		}
		if err := r.check(); err != nil {
			panic(fmt.Errorf("evalset: changes.json: %s: %w", name, err))
		}
		b, err := changeFiles.ReadFile(p)
		if err != nil {
			panic(err)
		}
		sum := sha1.Sum(b)
		tags := slices.Clone(r.Tags)
		slices.SortFunc(tags, func(a, b string) int { return slices.Index(ChangeTags, a) - slices.Index(ChangeTags, b) })
		out = append(out, Change{Name: name, Title: r.Title, Diff: string(b), SourceID: r.Source,
			Revision: hex.EncodeToString(sum[:]), Tags: tags, Severity: r.Severity, Reason: r.Reason})
	}
	return out
}

func (r rawChange) check() error {
	switch {
	case r.Title == "" || r.Source == "" || strings.TrimSpace(r.Reason) == "":
		return errors.New("title, source and reason are required")
	case len(r.Tags) == 0 || len(r.Tags) > len(ChangeTags):
		return fmt.Errorf("%d tags, want 1 to %d", len(r.Tags), len(ChangeTags))
	case !slices.Contains(Severities, r.Severity):
		return fmt.Errorf("bad severity %q", r.Severity)
	}
	for i, t := range r.Tags {
		if !slices.Contains(ChangeTags, t) || slices.Contains(r.Tags[:i], t) {
			return fmt.Errorf("bad or repeated tag %q", t)
		}
	}
	return nil
}

// ChangeAnswer is a change-review answer reduced to what scoring reads.
type ChangeAnswer struct {
	Severity string
	Tags     []string
	Codes    []string // the findings' codes, in order
}

// ReadChange reads a change-review answer, the JSON object
// {"schema_version", "severity", "tags", "findings": [{"code", "severity",
// "summary"}]}. It fails when output is not one JSON object or a field has
// the wrong JSON type; other fields are not checked.
func ReadChange(output []byte) (ChangeAnswer, error) {
	var a struct {
		Severity string   `json:"severity"`
		Tags     []string `json:"tags"`
		Findings []struct {
			Code string `json:"code"`
		} `json:"findings"`
	}
	if err := json.Unmarshal(output, &a); err != nil {
		return ChangeAnswer{}, fmt.Errorf("evalset: change-review answer: %w", err)
	}
	out := ChangeAnswer{Severity: a.Severity, Tags: a.Tags}
	for _, f := range a.Findings {
		out.Codes = append(out.Codes, f.Code)
	}
	return out, nil
}

// ChangeScore is how one change-review answer fares against its change.
type ChangeScore struct {
	// Tags is the F1 of the answer's tags against the expected ones: twice
	// the tags in both over the answer's distinct tags plus the expected
	// ones, 1 when both are empty.
	Tags float64
	// Severity is 1 when the answer's severity is the expected one, else 0.
	Severity float64
}

// ScoreChange scores answer a to change c; nil stands for no accepted
// answer, which scores 0 on both measures.
func ScoreChange(c Change, a *ChangeAnswer) ChangeScore {
	if a == nil {
		return ChangeScore{}
	}
	var s ChangeScore
	tags := slices.Compact(slices.Sorted(slices.Values(a.Tags)))
	both := 0
	for _, t := range tags {
		if slices.Contains(c.Tags, t) {
			both++
		}
	}
	if n := len(tags) + len(c.Tags); n == 0 {
		s.Tags = 1
	} else {
		s.Tags = 2 * float64(both) / float64(n)
	}
	if a.Severity == c.Severity {
		s.Severity = 1
	}
	return s
}

// changeReviewSet is Changes as a Set, scored by ScoreChange.
func changeReviewSet() Set {
	s := Set{Contract: "change-review", Measures: []string{"tags", "severity"}}
	for _, c := range Changes() {
		in, _ := json.Marshal(map[string]string{"diff": c.Diff, "title": c.Title})
		s.Cases = append(s.Cases, Case{Name: c.Name, SourceID: c.SourceID, Revision: c.Revision, Input: in,
			score: func(answer []byte) (Scored, error) {
				if answer == nil {
					sc := ScoreChange(c, nil)
					return Scored{Values: []float64{sc.Tags, sc.Severity}}, nil
				}
				a, err := ReadChange(answer)
				if err != nil {
					return Scored{}, err
				}
				sc := ScoreChange(c, &a)
				tags := slices.Compact(slices.Sorted(slices.Values(a.Tags)))
				codes := slices.Compact(slices.Sorted(slices.Values(a.Codes)))
				key := a.Severity + "|" + strings.Join(tags, ",") + "|" + strings.Join(codes, ",")
				return Scored{Values: []float64{sc.Tags, sc.Severity}, Key: key}, nil
			}})
	}
	return s
}
