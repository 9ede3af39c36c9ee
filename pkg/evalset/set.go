package evalset

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrNoSet is returned by For for a contract without an evaluation set.
var ErrNoSet = errors.New("evalset: no evaluation set")

// Set is one contract's evaluation set: its cases, each an input the
// contract takes with what a correct answer says, and the measures its
// rubric scores an answer with.
type Set struct {
	Contract string
	// Measures names the rubric's measures in the order Scored.Values
	// gives them: recall and precision for code-review, tags and severity
	// for change-review, category and human-review for moderation.
	Measures []string
	Cases    []Case
}

// Case is one item of a set.
type Case struct {
	Name     string // e.g. "05-checkout-state"
	SourceID string // where the item stands in for: owner/repo#number
	Revision string // 40 hex digits derived from the input, so stable
	// Input is the contract's input document for the item.
	Input json.RawMessage
	score func(answer []byte) (Scored, error)
}

// Scored is how one answer to a case fares.
type Scored struct {
	// Values holds one score per measure of the set, each between 0 and 1.
	Values []float64
	// Key is the answer reduced to what tells two answers apart: the places
	// of a code review's findings; a change review's severity, tags and
	// finding codes; a moderation verdict's category and human review.
	// Two answers to one case with the same key are the same answer to
	// the rubric.
	Key string
}

// Score scores answer, an accepted answer to c; a nil answer stands for
// none accepted, which each rubric scores as its worst honest reading (a
// code review that found nothing; zero for the other contracts).
func (c Case) Score(answer []byte) (Scored, error) {
	return c.score(answer)
}

// For is the evaluation set of the contract named name.
func For(name string) (Set, error) {
	switch name {
	case "code-review":
		return codeReviewSet(), nil
	case "change-review":
		return changeReviewSet(), nil
	case "moderation":
		return moderationSet(), nil
	}
	return Set{}, fmt.Errorf("%w for contract %q", ErrNoSet, name)
}

// codeReviewSet is Items as a Set, scored by ScoreItem.
func codeReviewSet() Set {
	s := Set{Contract: "code-review", Measures: []string{"recall", "precision"}}
	for _, it := range Items() {
		in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": it.Title})
		s.Cases = append(s.Cases, Case{Name: it.Name, SourceID: it.SourceID, Revision: it.Revision, Input: in,
			score: func(answer []byte) (Scored, error) {
				var fs []Finding
				if answer != nil {
					var err error
					if fs, err = Findings(answer); err != nil {
						return Scored{}, err
					}
				}
				sc := ScoreItem(it, fs)
				places := make([]string, 0, len(fs))
				for _, f := range fs {
					places = append(places, fmt.Sprintf("%s:%d", f.File, f.Line))
				}
				slices.Sort(places)
				return Scored{Values: []float64{sc.Recall, sc.Precision}, Key: strings.Join(slices.Compact(places), ",")}, nil
			}})
	}
	return s
}
