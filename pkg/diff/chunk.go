package diff

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"path"
	"strings"
)

// A diff too large for one model call is reviewed in parts. Split cuts it
// along its own structure: whole files where they fit, a file too large by
// its hunks, and a hunk too large by its lines (each piece a hunk of its
// own, with the header its lines need). Every part repeats the header of
// each file it holds, so a part is a diff on its own and a finding is
// grounded against the hunks its part holds.
//
// Files are taken riskiest first, by a rule that looks at paths alone:
//
//	rank 0  source: anything the rules below do not name
//	rank 1  tests: a _test, .test., .spec. or test_ file, or one under a
//	        test, tests, __tests__ or testdata directory
//	rank 2  documentation: .md, .rst, .txt, or under docs/
//	rank 3  generated or vendored: under vendor/, third_party/,
//	        node_modules/ or generated/; .pb.go, _gen.go, .gen., .min.js,
//	        .min.css, zz_generated
//	skipped lock files: go.sum, package-lock.json, yarn.lock,
//	        pnpm-lock.yaml, Cargo.lock, poetry.lock, Gemfile.lock,
//	        composer.lock, or any .lock file
//
// and within a rank in the diff's own order, so the same diff and the same
// budget always give the same parts, with the same ids.

// Part is one piece of a diff, reviewed by one model call.
type Part struct {
	// ID names the part under its work: p1, p2, … in review order.
	ID string
	// Digest is the first 12 hex digits of the SHA-256 of Text.
	Digest string
	// Files are the paths the part touches, in its order.
	Files []string
	// Text is the part as a unified diff.
	Text string
	// Units estimates the part's size in the model's units (tokens).
	Units int
	// Rank is the risk rank of the part's first file (0 riskiest).
	Rank int
}

// Skipped is a file left out of every part, and why.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Plan is a diff cut into parts.
type Plan struct {
	Parts   []Part
	Skipped []Skipped
}

// Units estimates text's size in model units at bytesPerUnit bytes each,
// rounding up.
func Units(text string, bytesPerUnit float64) int { return unitsOf(len(text), bytesPerUnit) }

// unitsOf is Units for text of n bytes.
func unitsOf(n int, bytesPerUnit float64) int {
	if bytesPerUnit <= 0 {
		bytesPerUnit = 1
	}
	return int(math.Ceil(float64(n) / bytesPerUnit))
}

// Split cuts d into parts of at most maxUnits units each (estimated at
// bytesPerUnit bytes a unit). A single line over the budget is a part of
// its own, the one case a part is larger.
func Split(d *Diff, maxUnits int, bytesPerUnit float64) (*Plan, error) {
	if maxUnits <= 0 {
		return nil, fmt.Errorf("diff: split: a part's budget must be positive, not %d", maxUnits)
	}
	p := &splitter{max: maxUnits, bpu: bytesPerUnit, plan: &Plan{}}
	for rank := range 4 {
		for i := range d.Files {
			f := &d.Files[i]
			r, skip := Risk(f.Path)
			if skip != "" {
				if rank == 0 {
					p.plan.Skipped = append(p.plan.Skipped, Skipped{Path: f.Path, Reason: skip})
				}
				continue
			}
			if r == rank {
				p.file(f, r)
			}
		}
	}
	p.flush()
	return p.plan, nil
}

// Risk is path's rank under the rule above, or why it is skipped.
func Risk(p string) (rank int, skipped string) {
	base := path.Base(p)
	dirs := "/" + p
	switch {
	case base == "go.sum" || base == "package-lock.json" || base == "yarn.lock" || base == "pnpm-lock.yaml" ||
		base == "Cargo.lock" || base == "poetry.lock" || base == "Gemfile.lock" || base == "composer.lock" ||
		strings.HasSuffix(base, ".lock"):
		return 0, "lock file"
	case strings.Contains(dirs, "/vendor/") || strings.Contains(dirs, "/third_party/") ||
		strings.Contains(dirs, "/node_modules/") || strings.Contains(dirs, "/generated/") ||
		strings.HasSuffix(base, ".pb.go") || strings.HasSuffix(base, "_gen.go") || strings.Contains(base, ".gen.") ||
		strings.HasSuffix(base, ".min.js") || strings.HasSuffix(base, ".min.css") || strings.HasPrefix(base, "zz_generated"):
		return 3, ""
	case strings.Contains(base, "_test.") || strings.Contains(base, ".test.") || strings.Contains(base, ".spec.") ||
		strings.HasPrefix(base, "test_") || strings.Contains(dirs, "/test/") || strings.Contains(dirs, "/tests/") ||
		strings.Contains(dirs, "/__tests__/") || strings.Contains(dirs, "/testdata/"):
		return 1, ""
	case strings.HasSuffix(base, ".md") || strings.HasSuffix(base, ".rst") || strings.HasSuffix(base, ".txt") ||
		strings.Contains(dirs, "/docs/"):
		return 2, ""
	}
	return 0, ""
}

type splitter struct {
	max  int
	bpu  float64
	plan *Plan
	// the part being filled
	text  strings.Builder
	files []string
	rank  int
}

// file adds f whole when it fits, else hunk by hunk.
func (p *splitter) file(f *File, rank int) {
	var body strings.Builder
	for _, h := range f.Hunks {
		body.WriteString(h.text())
	}
	if Units(f.Header+body.String(), p.bpu) <= p.max || len(f.Hunks) == 0 {
		// (A header alone over the budget, a very long path, is a part
		// of its own.)
		p.add(f.Path, f.Header, body.String(), rank)
		return
	}
	for _, h := range f.Hunks {
		for _, piece := range p.pieces(f.Header, h) {
			p.add(f.Path, f.Header, piece, rank)
		}
	}
}

// add puts body, hunks of file under the header hdr, in the part being
// filled, or in a new part when it does not fit there. Hunks of the file
// the part ends with join it without their header again.
func (p *splitter) add(file, hdr, body string, rank int) {
	if n := len(p.files); n > 0 && p.files[n-1] == file && p.fits(body) {
		p.text.WriteString(body)
		return
	}
	if !p.fits(hdr + body) {
		p.flush()
	}
	if len(p.files) == 0 {
		p.rank = rank
	}
	p.files = append(p.files, file)
	p.text.WriteString(hdr + body)
}

// fits reports whether text can join the part being filled.
func (p *splitter) fits(text string) bool {
	return Units(text, p.bpu)+Units(p.text.String(), p.bpu) <= p.max
}

// flush closes the part being filled.
func (p *splitter) flush() {
	if len(p.files) == 0 {
		return
	}
	text := p.text.String()
	sum := sha256.Sum256([]byte(text))
	p.plan.Parts = append(p.plan.Parts, Part{
		ID:     fmt.Sprintf("p%d", len(p.plan.Parts)+1),
		Digest: hex.EncodeToString(sum[:6]),
		Files:  p.files,
		Text:   text,
		Units:  Units(text, p.bpu),
		Rank:   p.rank,
	})
	p.text.Reset()
	p.files = nil
}

// pieces cuts hunk h of a file with header hdr into hunk texts, each of at
// most the budget with the header: h whole when it fits, else runs of its
// lines, each a hunk with the ranges its lines give it.
func (p *splitter) pieces(hdr string, h Hunk) []string {
	if Units(hdr+h.text(), p.bpu) <= p.max {
		return []string{h.text()}
	}
	var out []string
	// The next old and new line numbers (a side with no lines names the
	// line before the hunk).
	oldAt, newAt := h.OldStart, h.NewStart
	if h.OldLines == 0 {
		oldAt++
	}
	if h.NewLines == 0 {
		newAt++
	}
	var run []Line
	runOld, runNew, runBytes := oldAt, newAt, 0
	emit := func() {
		if len(run) > 0 {
			out = append(out, hunkOf(runOld, runNew, h.Section, run).text())
		}
	}
	// A run's size is its lines' bytes and its header, at most as long as
	// one with this hunk's largest numbers.
	head := len(fmt.Sprintf("@@ -%d,%d +%d,%d @@ %s\n", h.OldStart+h.OldLines, h.OldLines, h.NewStart+h.NewLines, h.NewLines, h.Section))
	for _, l := range h.Lines {
		size := len(l.Text) + 2 // marker and newline
		if len(run) > 0 && unitsOf(len(hdr)+head+runBytes+size, p.bpu) > p.max {
			emit()
			run, runOld, runNew, runBytes = nil, oldAt, newAt, 0
		}
		run, runBytes = append(run, l), runBytes+size
		if l.Kind != Added {
			oldAt++
		}
		if l.Kind != Removed {
			newAt++
		}
	}
	emit()
	return out
}

// hunkOf is a hunk of lines starting at old line oldStart and new line
// newStart.
func hunkOf(oldStart, newStart int, section string, lines []Line) Hunk {
	h := Hunk{OldStart: oldStart, NewStart: newStart, Section: section, Lines: lines}
	for _, l := range lines {
		if l.Kind != Added {
			h.OldLines++
		}
		if l.Kind != Removed {
			h.NewLines++
		}
	}
	// A side with no lines names the line before the hunk, as diff does.
	if h.OldLines == 0 && h.OldStart > 0 {
		h.OldStart--
	}
	if h.NewLines == 0 && h.NewStart > 0 {
		h.NewStart--
	}
	return h
}

// text writes h as a unified diff hunk.
func (h Hunk) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "@@ -%d,%d +%d,%d @@", h.OldStart, h.OldLines, h.NewStart, h.NewLines)
	if h.Section != "" {
		b.WriteString(" " + h.Section)
	}
	b.WriteByte('\n')
	for _, l := range h.Lines {
		b.WriteByte(l.Kind)
		b.WriteString(l.Text)
		b.WriteByte('\n')
	}
	return b.String()
}

// Coverage is what a review in parts covered, kept with its answer and
// shown with its result.
type Coverage struct {
	// Parts is how many parts the diff was cut into; Reviewed the ids of
	// those reviewed.
	Parts    int      `json:"parts"`
	Reviewed []string `json:"reviewed"`
	// Files are the files reviewed; Left those of parts not reviewed;
	// Skipped the files no part holds.
	Files   []string  `json:"files"`
	Left    []string  `json:"left,omitempty"`
	Skipped []Skipped `json:"skipped,omitempty"`
	// Partial is set when parts were left unreviewed; Why says what
	// stopped the review.
	Partial bool   `json:"partial"`
	Why     string `json:"why,omitempty"`
	// Folded counts findings two parts both made, kept once; Dropped the
	// findings past the contract's cap, least severe first.
	Folded  int `json:"folded,omitempty"`
	Dropped int `json:"dropped,omitempty"`
	// Earlier are the parts a review this one continues had reviewed and
	// published, and Of that review's first work: a continuation neither
	// reviews nor shows them again.
	Earlier []string `json:"earlier,omitempty"`
	Of      string   `json:"of,omitempty"`
	// LeftCost is what the parts left would cost at their estimates, in
	// micro-dollars: the cap a continuation needs to review them all.
	LeftCost int64 `json:"leftCost,omitempty"`
}
