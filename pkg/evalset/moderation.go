// The moderation set
//
// moderation.json holds twelve short texts of a shop's reviews, questions
// and support messages, each with the verdict a careful moderator gives
// it: the moderation contract's category (abuse, spam, self_harm, other)
// and whether a person must look (needsHumanReview: always for self_harm,
// otherwise only when the text is unclear), with a sentence saying why. An
// answer is scored on two measures:
//
//   - category: 1 when its category is the expected one, else 0;
//   - human-review: 1 when its needsHumanReview is the expected one, else 0.
//
// An item without an accepted answer scores 0 on both.

package evalset

import (
	"bytes"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

//go:embed moderation.json
var moderationJSON []byte

// ModerationCategories is the moderation contract's closed set.
var ModerationCategories = []string{"abuse", "spam", "self_harm", "other"}

// Post is one item of the moderation set: a text a user posted and the
// verdict a correct moderator gives it.
type Post struct {
	Name     string // e.g. "07-end-my-life"
	Text     string
	SourceID string // owner/repo#number of the thread it stands in for
	Revision string // 40 hex digits derived from the text
	Category string
	// NeedsHumanReview is whether a person must look at it.
	NeedsHumanReview bool
	Reason           string
}

type rawPost struct {
	Source           string `json:"source"`
	Text             string `json:"text"`
	Category         string `json:"category"`
	NeedsHumanReview *bool  `json:"needsHumanReview"`
	Reason           string `json:"reason"`
}

// Posts returns the moderation set in name order. It panics if
// moderation.json is malformed (a category outside the contract's set, a
// missing text, origin, reason or needsHumanReview), which tests guard
// against.
func Posts() []Post {
	var raw map[string]rawPost
	dec := json.NewDecoder(bytes.NewReader(moderationJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		panic(fmt.Errorf("evalset: moderation.json: %w", err))
	}
	out := make([]Post, 0, len(raw))
	for name, r := range raw {
		if err := r.check(); err != nil {
			panic(fmt.Errorf("evalset: moderation.json: %s: %w", name, err))
		}
		sum := sha1.Sum([]byte(r.Text))
		out = append(out, Post{Name: name, Text: r.Text, SourceID: r.Source, Revision: hex.EncodeToString(sum[:]),
			Category: r.Category, NeedsHumanReview: *r.NeedsHumanReview, Reason: r.Reason})
	}
	slices.SortFunc(out, func(a, b Post) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (r rawPost) check() error {
	switch {
	case strings.TrimSpace(r.Text) == "" || r.Source == "" || strings.TrimSpace(r.Reason) == "":
		return errors.New("text, source and reason are required")
	case !slices.Contains(ModerationCategories, r.Category):
		return fmt.Errorf("bad category %q", r.Category)
	case r.NeedsHumanReview == nil:
		return errors.New("needsHumanReview is required")
	case r.Category == "self_harm" && !*r.NeedsHumanReview:
		return errors.New("self_harm always needs human review")
	}
	return nil
}

// Verdict is a moderation answer reduced to what scoring reads.
type Verdict struct {
	Category         string
	NeedsHumanReview bool
}

// ReadVerdict reads a moderation answer, the JSON object {"category",
// "confidence", "needsHumanReview"}. It fails when output is not one JSON
// object or a field has the wrong JSON type; other fields are not checked.
func ReadVerdict(output []byte) (Verdict, error) {
	var v struct {
		Category         string `json:"category"`
		NeedsHumanReview bool   `json:"needsHumanReview"`
	}
	if err := json.Unmarshal(output, &v); err != nil {
		return Verdict{}, fmt.Errorf("evalset: moderation answer: %w", err)
	}
	return Verdict(v), nil
}

// PostScore is how one moderation answer fares against its post: each
// measure 1 when the answer agrees with the expected verdict, else 0.
type PostScore struct {
	Category, HumanReview float64
}

// ScorePost scores verdict v of post p; nil stands for no accepted answer,
// which scores 0 on both measures.
func ScorePost(p Post, v *Verdict) PostScore {
	var s PostScore
	if v == nil {
		return s
	}
	if v.Category == p.Category {
		s.Category = 1
	}
	if v.NeedsHumanReview == p.NeedsHumanReview {
		s.HumanReview = 1
	}
	return s
}

// moderationSet is Posts as a Set, scored by ScorePost.
func moderationSet() Set {
	s := Set{Contract: "moderation", Measures: []string{"category", "human-review"}}
	for _, p := range Posts() {
		in, _ := json.Marshal(map[string]string{"text": p.Text})
		s.Cases = append(s.Cases, Case{Name: p.Name, SourceID: p.SourceID, Revision: p.Revision, Input: in,
			score: func(answer []byte) (Scored, error) {
				if answer == nil {
					sc := ScorePost(p, nil)
					return Scored{Values: []float64{sc.Category, sc.HumanReview}}, nil
				}
				v, err := ReadVerdict(answer)
				if err != nil {
					return Scored{}, err
				}
				sc := ScorePost(p, &v)
				return Scored{Values: []float64{sc.Category, sc.HumanReview}, Key: v.Category + "|" + strconv.FormatBool(v.NeedsHumanReview)}, nil
			}})
	}
	return s
}
