// Scoring a review
//
// A code-review answer for an item is scored against the item's Expect (the
// issues a correct reviewer must report) and Extras (findings it may report
// without being wrong). A finding refers to an expected issue or an extra
// when it names the same file and its line lies within the range, both ends
// included. Three figures come out:
//
//   - Recall: the share of expected issues that at least one finding refers
//     to. It measures what the reviewer missed. An item with no expected
//     issue has recall 1.
//   - Precision: the share of findings that are useful, that is, refer to an
//     expected issue or, failing that, to an extra. It measures noise: a
//     finding that refers to neither is wrong. An empty answer has
//     precision 1.
//   - Category agreement: among the findings that refer to an expected issue
//     and carry a category (the code-review contract has one from
//     schemaVersion 2 on), how many give the expected issue's category. It is
//     reported as a count out of a count, not folded into the other two.
//
// Several findings may refer to the same expected issue; the issue counts once
// toward recall and each such finding counts as useful toward precision.
// Totals adds the counts over items before dividing (micro-averaging), so an
// item with many issues weighs more than one with few.

package evalset

import (
	"errors"
	"fmt"
	"slices"

	"assay.dev/pkg/gate"
)

// Finding is one finding of a review, reduced to what scoring needs. File is
// the new path as after "b/" in the diff, Line a new-file line number, and
// Category the finding's category, "" when the answer has none.
type Finding struct {
	File     string
	Line     int
	Category string
}

// Findings reads a code-review answer, the JSON object
// {"schemaVersion", "changeId", "findings": [{"file", "line", "severity",
// "summary", "evidence", "category", "confidence"}]} ("category" and
// "confidence" exist from schemaVersion 2 on), and returns its findings in
// order. Only file, line and category are kept; other fields are not checked.
// It fails when output is not one JSON object, when "findings" is missing or
// null, or when a finding's file, line or category has the wrong JSON type.
func Findings(output []byte) ([]Finding, error) {
	// Read as the gate reads it, so a line written 2.0 is line 2 here as
	// on the pull request.
	acc, err := gate.Read(output)
	if err != nil {
		return nil, fmt.Errorf("evalset: code-review answer: %w", err)
	}
	if acc.Doc["findings"] == nil {
		return nil, errors.New(`evalset: code-review answer: no "findings" array`)
	}
	out := make([]Finding, 0, len(acc.Findings))
	for _, f := range acc.Findings {
		out = append(out, Finding{File: f.File, Line: f.Line, Category: f.Category})
	}
	return out, nil
}

// Score is how one review of one item fares against the item's expected
// findings.
type Score struct {
	Item string // the item's name
	// Expected is the number of issues the item expects, Found the number of
	// findings in the review.
	Expected, Found int
	// Matched is the number of expected issues that at least one finding
	// refers to.
	Matched int
	// Acceptable is the number of findings that refer to no expected issue
	// but to an extra.
	Acceptable int
	// Wrong is the number of findings that refer to neither an expected
	// issue nor an extra.
	Wrong int
	// Recall is Matched/Expected, or 1 when Expected is 0.
	Recall float64
	// Precision is (Found-Wrong)/Found, the share of findings that refer to
	// an expected issue or an extra, or 1 when Found is 0.
	Precision float64
	// CategoryKnown is the number of findings that refer to an expected issue
	// and carry a category; CategoryAgree is how many of those give the
	// category of an expected issue they refer to.
	CategoryAgree, CategoryKnown int
	// Missed lists the expected issues no finding refers to, in the item's
	// order.
	Missed []Expect
}

// ScoreItem scores the findings fs of a review of it. A finding refers to an
// expected issue or an extra when its File equals the File and
// From <= Line <= To.
func ScoreItem(it Item, fs []Finding) Score {
	s := Score{Item: it.Name, Expected: len(it.Expect), Found: len(fs)}
	found := make([]bool, len(it.Expect))
	for _, f := range fs {
		refers, agrees := false, false
		for i, e := range it.Expect {
			if f.File == e.File && e.From <= f.Line && f.Line <= e.To {
				refers = true
				found[i] = true
				agrees = agrees || f.Category == e.Category
			}
		}
		switch {
		case refers:
			if f.Category != "" {
				s.CategoryKnown++
				if agrees {
					s.CategoryAgree++
				}
			}
		case slices.ContainsFunc(it.Extras, func(x Extra) bool {
			return f.File == x.File && x.From <= f.Line && f.Line <= x.To
		}):
			s.Acceptable++
		default:
			s.Wrong++
		}
	}
	for i, e := range it.Expect {
		if found[i] {
			s.Matched++
		} else {
			s.Missed = append(s.Missed, e)
		}
	}
	s.Recall = ratio(s.Matched, s.Expected)
	s.Precision = ratio(s.Found-s.Wrong, s.Found)
	return s
}

// Total sums the scores of several items.
type Total struct {
	// Items is the number of scores summed; Expected, Matched, Found and
	// Wrong are the sums of the scores' fields of the same name.
	Items, Expected, Matched, Found int
	// Useful is the number of findings that refer to an expected issue or an
	// extra: the sum of Found-Wrong.
	Useful, Wrong int
	// Recall is Matched/Expected, or 1 when Expected is 0.
	Recall float64
	// Precision is Useful/Found, or 1 when Found is 0.
	Precision float64
	// CategoryAgree and CategoryKnown are the sums of the scores' fields of
	// the same name.
	CategoryAgree, CategoryKnown int
}

// Totals sums scores into one Total, micro-averaged: recall and precision are
// computed from the summed counts, not averaged over items.
func Totals(scores []Score) Total {
	t := Total{Items: len(scores)}
	for _, s := range scores {
		t.Expected += s.Expected
		t.Matched += s.Matched
		t.Found += s.Found
		t.Useful += s.Found - s.Wrong
		t.Wrong += s.Wrong
		t.CategoryAgree += s.CategoryAgree
		t.CategoryKnown += s.CategoryKnown
	}
	t.Recall = ratio(t.Matched, t.Expected)
	t.Precision = ratio(t.Useful, t.Found)
	return t
}

// ratio is n/d, or 1 when d is 0.
func ratio(n, d int) float64 {
	if d == 0 {
		return 1
	}
	return float64(n) / float64(d)
}
