// Package diff parses unified diffs (git's format) far enough to ground a
// model's findings: which files a change touches, which new-file lines sit in a
// changed hunk, and what text the change contains.
package diff

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Kind of one diff line.
const (
	Added   = '+'
	Removed = '-'
	Context = ' '
)

// Line is one body line of a hunk.
type Line struct {
	Kind byte   // Added, Removed or Context
	Text string // the line without its marker
	// NewLine is the line number in the new file; 0 for removed lines.
	NewLine int
}

// Hunk is one @@ section.
type Hunk struct {
	OldStart, OldLines int
	NewStart, NewLines int
	// Section is the text after the header's second @@ (git's function
	// context), trimmed.
	Section string
	Lines   []Line
}

// File is the part of a diff that touches one path.
type File struct {
	// Path is the new path ("b/" stripped); for a deleted file, the old path.
	Path    string
	OldPath string
	Deleted bool
	Hunks   []Hunk
	// Header is the section's lines before its first hunk, as written
	// (diff --git, index, mode, --- and +++), each ending in a newline.
	Header string
}

// Diff is a parsed unified diff.
type Diff struct {
	Files []File
}

// ErrEmpty is returned for input that holds no file section at all.
var ErrEmpty = errors.New("diff: no file sections")

// Parse reads a unified diff. It accepts both `diff --git` output and plain
// `---`/`+++` pairs, and refuses hunks whose line counts do not add up.
func Parse(s string) (*Diff, error) {
	p := &parser{d: &Diff{}, lines: strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n")}
	for ; p.i < len(p.lines); p.i++ {
		if err := p.line(); err != nil {
			return nil, err
		}
	}
	p.header(len(p.lines))
	if len(p.d.Files) == 0 {
		return nil, ErrEmpty
	}
	return p.d, nil
}

// parser is Parse's state: the diff read so far, the file section being
// read and the line it is at.
type parser struct {
	d     *Diff
	lines []string
	cur   *File
	start int // the current section's first line
	i     int // the line being read
}

// line reads the line at p.i: a section's header line or, with a hunk
// header, the whole hunk. Other lines are skipped.
func (p *parser) line() error {
	l := p.lines[p.i]
	switch {
	case strings.HasPrefix(l, "diff --git "):
		p.gitLine(l)
	case strings.HasPrefix(l, "--- "):
		p.oldPathLine(l)
	case strings.HasPrefix(l, "+++ "):
		return p.newPathLine(l)
	case strings.HasPrefix(l, "@@"):
		return p.hunk(l)
	}
	return nil
}

// header sets the current section's Header to its lines before end, less
// trailing blank lines, unless it has one already or has hunks.
func (p *parser) header(end int) {
	if p.cur != nil && p.cur.Header == "" && len(p.cur.Hunks) == 0 {
		for end > p.start && strings.TrimSpace(p.lines[end-1]) == "" {
			end--
		}
		p.cur.Header = strings.Join(p.lines[p.start:end], "\n") + "\n"
	}
}

// section ends the current section and starts a new one at p.i.
func (p *parser) section() {
	p.header(p.i)
	p.d.Files = append(p.d.Files, File{})
	p.cur, p.start = &p.d.Files[len(p.d.Files)-1], p.i
}

// gitLine reads a `diff --git` line: it always starts a section.
func (p *parser) gitLine(l string) {
	p.section()
	if a, b, ok := gitPaths(l); ok {
		p.cur.OldPath, p.cur.Path = a, b
	}
}

// oldPathLine reads a `---` line: it starts a section unless it belongs to
// the current one's header.
func (p *parser) oldPathLine(l string) {
	if p.cur == nil || len(p.cur.Hunks) > 0 {
		p.section()
	}
	if path := stripPath(l[4:], "a/"); path != "" {
		p.cur.OldPath = path
	}
}

// newPathLine reads a `+++` line; without a new path the file is deleted.
func (p *parser) newPathLine(l string) error {
	if p.cur == nil {
		return fmt.Errorf("diff: line %d: +++ without ---", p.i+1)
	}
	path := stripPath(l[4:], "b/")
	if path == "" {
		p.cur.Deleted = true
		p.cur.Path = p.cur.OldPath
	} else {
		p.cur.Path = path
	}
	return nil
}

// hunk reads the hunk whose header l is, and its body, into the current
// section, leaving p.i at the hunk's last line.
func (p *parser) hunk(l string) error {
	if p.cur == nil || p.cur.Path == "" {
		return fmt.Errorf("diff: line %d: hunk before file header", p.i+1)
	}
	h, err := parseHunkHeader(l)
	if err != nil {
		return fmt.Errorf("diff: line %d: %w", p.i+1, err)
	}
	p.header(p.i)
	if err := p.hunkBody(&h); err != nil {
		return err
	}
	p.cur.Hunks = append(p.cur.Hunks, h)
	return nil
}

// hunkBody reads the body lines after h's header until they add up to the
// line counts the header gives.
func (p *parser) hunkBody(h *Hunk) error {
	oldLeft, newLeft, n := h.OldLines, h.NewLines, h.NewStart
	at := p.i + 1 // the hunk header's line
	for oldLeft > 0 || newLeft > 0 {
		p.i++
		if p.i >= len(p.lines) {
			return fmt.Errorf("diff: the hunk at line %d ends early", at)
		}
		b := p.lines[p.i]
		if strings.HasPrefix(b, `\ `) { // "\ No newline at end of file"
			continue
		}
		kind := byte(Context)
		if b != "" {
			kind = b[0]
			b = b[1:]
		}
		switch kind {
		case Added:
			h.Lines = append(h.Lines, Line{Kind: Added, Text: b, NewLine: n})
			n++
			newLeft--
		case Removed:
			h.Lines = append(h.Lines, Line{Kind: Removed, Text: b})
			oldLeft--
		case Context:
			h.Lines = append(h.Lines, Line{Kind: Context, Text: b, NewLine: n})
			n++
			newLeft--
			oldLeft--
		default:
			return fmt.Errorf("diff: line %d: a line inside a hunk must start with ' ', '+' or '-'", p.i+1)
		}
		if oldLeft < 0 || newLeft < 0 {
			return fmt.Errorf("diff: the hunk at line %d has more lines than its header says", at)
		}
	}
	return nil
}

func gitPaths(l string) (string, string, bool) {
	rest := strings.TrimPrefix(l, "diff --git ")
	i := strings.Index(rest, " b/")
	if !strings.HasPrefix(rest, "a/") || i < 0 {
		return "", "", false
	}
	return rest[2:i], rest[i+3:], true
}

func stripPath(p, prefix string) string {
	if i := strings.IndexByte(p, '\t'); i >= 0 {
		p = p[:i]
	}
	p = strings.TrimSpace(p)
	if p == "/dev/null" {
		return ""
	}
	return strings.TrimPrefix(p, prefix)
}

func parseHunkHeader(l string) (Hunk, error) {
	// @@ -a,b +c,d @@ optional section
	f := strings.Fields(l)
	if len(f) < 4 || f[0] != "@@" || f[3] != "@@" || !strings.HasPrefix(f[1], "-") || !strings.HasPrefix(f[2], "+") {
		return Hunk{}, errors.New("malformed hunk header")
	}
	var h Hunk
	var err error
	if _, after, ok := strings.Cut(l[2:], "@@"); ok {
		h.Section = strings.TrimSpace(after)
	}
	if h.OldStart, h.OldLines, err = rangeOf(f[1][1:]); err != nil {
		return Hunk{}, err
	}
	if h.NewStart, h.NewLines, err = rangeOf(f[2][1:]); err != nil {
		return Hunk{}, err
	}
	return h, nil
}

func rangeOf(s string) (start, n int, err error) {
	a, b, has := strings.Cut(s, ",")
	if start, err = strconv.Atoi(a); err != nil || start < 0 {
		return 0, 0, errors.New("bad hunk range")
	}
	n = 1
	if has {
		if n, err = strconv.Atoi(b); err != nil || n < 0 {
			return 0, 0, errors.New("bad hunk range")
		}
	}
	return start, n, nil
}

// File returns the section for path, or nil when the diff does not touch it.
func (d *Diff) File(path string) *File {
	for i := range d.Files {
		if d.Files[i].Path == path {
			return &d.Files[i]
		}
	}
	return nil
}

// InHunk reports whether new-file line n lies inside one of f's hunks.
func (f *File) InHunk(n int) bool {
	for _, h := range f.Hunks {
		if n >= h.NewStart && n < h.NewStart+h.NewLines {
			return true
		}
	}
	return false
}

// Contains reports whether text (whitespace-trimmed, non-empty) occurs in the
// text of one of f's hunk lines.
func (f *File) Contains(text string) bool {
	t := strings.TrimSpace(text)
	if t == "" {
		return false
	}
	for _, h := range f.Hunks {
		for _, l := range h.Lines {
			if strings.Contains(l.Text, t) {
				return true
			}
		}
	}
	return false
}

// Added returns f's added lines in order.
func (f *File) Added() []Line {
	var out []Line
	for _, h := range f.Hunks {
		for _, l := range h.Lines {
			if l.Kind == Added {
				out = append(out, l)
			}
		}
	}
	return out
}
