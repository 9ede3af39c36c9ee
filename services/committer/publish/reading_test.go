package publish

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// The gate and the publisher read one answer alike, however it is spelled.
// Each round makes a code review (version 1 or 2) of a random diff with
// findings the gate accepts, and writes it twice, each time with its
// numbers spelled any way JSON allows (2, 2.0, 2e0, 20e-1, 0.2e1, …), its
// keys in a random order, a duplicate key here and there (the last one
// counts), random insignificant whitespace, and its strings — Unicode
// among them — with random escapes (\u0041, \/, surrogate pairs). Both
// writings must be accepted with the same canonical JSON, and each
// finding must be on the published plan exactly once, at its file and
// line, with its severity and summary. The same answer with one finding
// repeated under another spelling of its line must be refused as a
// duplicate.
func TestEachAcceptedFindingPublishedOnce(t *testing.T) {
	t.Parallel()
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 400
	for seed := range uint64(rounds) {
		r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		a := genAnswer(r)
		c, ok := reg.Version(fmt.Sprintf("code-review/%d", a.version))
		if !ok {
			t.Fatalf("no contract code-review/%d", a.version)
		}
		exp := gate.Expect{WorkID: a.changeID, SchemaVersion: c.SchemaVersion, TaxonomyVersion: c.TaxonomyVersion,
			CurrentTaxonomyVersion: c.TaxonomyVersion, Digest: "sha256:00", CurrentDigest: "sha256:00", Input: a.input()}
		first, second := a.spell(r, -1), a.spell(r, -1)
		acc, fail := gate.Check(c, []byte(first), exp)
		if fail != nil {
			t.Fatalf("seed %d: the gate refused %s: %v", seed, first, fail)
		}
		again, fail := gate.Check(c, []byte(second), exp)
		if fail != nil {
			t.Fatalf("seed %d: the gate refused %s: %v", seed, second, fail)
		}
		if string(acc.Output) != string(again.Output) {
			t.Fatalf("seed %d: two spellings of one answer read otherwise:\n%s\n%s", seed, acc.Output, again.Output)
		}
		fs, err := Findings(acc.Output)
		if err != nil {
			t.Fatalf("seed %d: the publisher cannot read %s: %v", seed, acc.Output, err)
		}
		plan := Decide(Input{WorkID: a.changeID, Outcome: outcome.Accepted, Findings: fs, Policy: store.CheckBlocking})
		if len(plan.Comments) != len(a.findings) {
			t.Fatalf("seed %d: %d comments for %d findings accepted from %s", seed, len(plan.Comments), len(a.findings), first)
		}
		blocking := false
		for i, f := range a.findings {
			body := fmt.Sprintf("**%s**: %s", f.severity, f.summary)
			n := 0
			for _, cm := range plan.Comments {
				if cm.Path == f.file && cm.Line == f.line && cm.Body == body {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("seed %d: findings[%d] (%s line %d) is on the plan %d times; accepted from %s\nplan %+v",
					seed, i, f.file, f.line, n, first, plan.Comments)
			}
			blocking = blocking || f.severity == "blocking"
		}
		want := "neutral"
		switch {
		case blocking:
			want = "failure"
		case len(a.findings) == 0:
			want = "success"
		}
		if plan.CheckRun == nil || plan.CheckRun.Conclusion != want {
			t.Fatalf("seed %d: check run %+v, want %s", seed, plan.CheckRun, want)
		}
		if len(a.findings) > 0 {
			dup := r.IntN(len(a.findings))
			twice := a.spell(r, dup)
			if _, fail := gate.Check(c, []byte(twice), exp); fail == nil || fail.Code != gate.CodeDuplicateFinding {
				t.Fatalf("seed %d: findings[%d] repeated in %s: %v; want %s", seed, dup, twice, fail, gate.CodeDuplicateFinding)
			}
		}
	}
}

// An accepted answer the publisher cannot read fails its publication for
// good, with the reason, and nothing reaches the pull request — never a
// check run that says "No findings". A result stored before results were
// stored canonical, its blocking finding's line written 2.0, is published
// as the gate read it: a blocking comment on line 2 that fails the check.
func TestUnreadableAnswerFailsItsPublication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if err := b.st.SetCheckPolicy(ctx, "acme", store.CheckBlocking); err != nil {
		t.Fatal(err)
	}
	bad := b.acceptedWith(t, 81, `{"schemaVersion":1,"changeId":"c","findings":[
		{"file":"cart.js","line":"twelve","severity":"blocking","summary":"total can go negative","evidence":"total -= d"}]}`)
	if err := b.pub.Publish(ctx, outcomeOf(bad)); err != nil {
		t.Fatal(err)
	}
	pub, err := b.st.GetPublication(ctx, bad.ID, TargetGitHub)
	if err != nil || pub.State != store.PublicationFailed || !strings.Contains(pub.Reason, "the accepted answer cannot be read") ||
		!strings.Contains(pub.Reason, "findings[0].line is not a line number") {
		t.Fatalf("publication of an unreadable answer: %+v, %v; want it failed, saying why", pub, err)
	}
	if runs, n := b.gh.CheckRuns(), b.gh.CommentsOf(bad.ID); len(runs) != 0 || n != 0 {
		t.Fatalf("GitHub got %+v and %d comments for an unreadable answer; want nothing", runs, n)
	}
	// Without a GitHub App the dry record fails alike, rather than record
	// a plan of no findings.
	dry := setup(t, func(c *Config) { c.GitHub = nil })
	w := dry.acceptedWith(t, 83, `{"schemaVersion":1,"changeId":"c","findings":{"file":"cart.js"}}`)
	if err := dry.pub.Publish(ctx, outcomeOf(w)); err != nil {
		t.Fatal(err)
	}
	if pub, err := dry.st.GetPublication(ctx, w.ID, TargetDry); err != nil || pub.State != store.PublicationFailed ||
		!strings.Contains(pub.Reason, "findings is an object, not an array") {
		t.Fatalf("dry publication of an unreadable answer: %+v, %v; want it failed, saying why", pub, err)
	}

	old := b.acceptedWith(t, 82, `{"schemaVersion":1,"changeId":"c","findings":[
		{"file":"cart.js","line":2.0,"severity":"blocking","summary":"total can go negative","evidence":"total -= d"}]}`)
	if err := b.pub.Publish(ctx, outcomeOf(old)); err != nil {
		t.Fatal(err)
	}
	cs := b.gh.Comments()
	if len(cs) != 1 || cs[0].Path != "cart.js" || cs[0].Line != 2 || !strings.HasPrefix(cs[0].Body, "**blocking**: total can go negative") {
		t.Fatalf("comments %+v; want one blocking comment on cart.js line 2", cs)
	}
	if runs := b.gh.CheckRuns(); len(runs) != 1 || runs[0].ExternalID != old.ID || runs[0].Conclusion != "failure" {
		t.Fatalf("check runs %+v; want the one of %s, failed by its blocking finding", runs, old.ID)
	}
}

// answer is one generated code review: its diff and its findings.
type answer struct {
	version  int // of the code-review contract: 1, or 2 with category and confidence
	changeID string
	files    []genFile
	findings []genFinding
}

type genFile struct {
	path  string
	start int      // the hunk's first new line
	lines []string // the hunk's lines, new lines start, start+1, …
	added int      // the last added lines of the hunk
}

type genFinding struct {
	file, severity, category, summary, evidence string
	line                                        int
	confidence                                  int // thousandths
}

var (
	paths      = []string{"src/cart.js", "pkg/a/b_c.go", "docs/read-me.md", "lib/x.py"}
	severities = []string{"info", "warning", "blocking"}
	categories = []string{"correctness", "security", "data-integrity", "money", "concurrency", "maintainability"}
	// alphabet holds what summaries are made of: ASCII, what JSON must or
	// may escape, Latin-1, CJK, a character outside the BMP, U+2028.
	alphabet = []rune("abcXYZ 019_-.,:;!?'\"\\/<>&\t\néüßñ日本語文🙂🚀\u2028€")
)

func genAnswer(r *rand.Rand) answer {
	a := answer{version: 1 + r.IntN(2), changeID: fmt.Sprintf("w_prop%d", r.IntN(1e6))}
	for _, i := range r.Perm(len(paths))[:1+r.IntN(len(paths))] {
		f := genFile{path: paths[i], start: 1 + r.IntN(200), added: 1 + r.IntN(4)}
		for j := range 1 + r.IntN(3) + f.added {
			f.lines = append(f.lines, fmt.Sprintf(`v%d_%d := "ü/€\\日%d" // <é> & 'q'`, i, j, r.IntN(1e4)))
		}
		a.files = append(a.files, f)
	}
	seen := map[string]bool{}
	for range r.IntN(7) {
		f := a.files[r.IntN(len(a.files))]
		k := r.IntN(len(f.lines))
		g := genFinding{file: f.path, line: f.start + k, severity: severities[r.IntN(3)], summary: randText(r),
			evidence: f.lines[r.IntN(len(f.lines))]}
		if a.version == 2 {
			g.category, g.confidence = categories[r.IntN(len(categories))], r.IntN(1001)
		}
		key := fmt.Sprint(g.file, g.line, g.summary)
		if seen[key] {
			continue
		}
		seen[key] = true
		a.findings = append(a.findings, g)
	}
	return a
}

func randText(r *rand.Rand) string {
	var b strings.Builder
	for range 1 + r.IntN(30) {
		b.WriteRune(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// input is the work's input: the diff the findings are grounded in.
func (a answer) input() json.RawMessage {
	var d strings.Builder
	for _, f := range a.files {
		ctx := len(f.lines) - f.added
		fmt.Fprintf(&d, "diff --git a/%s b/%s\n--- a/%s\n+++ b/%s\n@@ -%d,%d +%d,%d @@\n", f.path, f.path, f.path, f.path,
			f.start, ctx, f.start, len(f.lines))
		for j, l := range f.lines {
			mark := " "
			if j >= ctx {
				mark = "+"
			}
			d.WriteString(mark + l + "\n")
		}
	}
	b, _ := json.Marshal(map[string]string{"diff": d.String()})
	return b
}

// Values of the JSON the spellers write.
type (
	jint   int     // an integer
	jmilli int     // a number in thousandths
	jobj   []field // an object, written in a random order
	field  struct {
		k string
		v any
	}
)

// spell writes the answer in random spellings; dup, when not negative, is
// the index of a finding written twice (the second time with its line
// spelled afresh).
func (a answer) spell(r *rand.Rand, dup int) string {
	var fs []any
	for i, f := range a.findings {
		o := jobj{{"file", f.file}, {"line", jint(f.line)}, {"severity", f.severity}, {"summary", f.summary}, {"evidence", f.evidence}}
		if a.version == 2 {
			o = append(o, field{"category", f.category}, field{"confidence", jmilli(f.confidence)})
		}
		fs = append(fs, o)
		if i == dup {
			fs = append(fs, o)
		}
	}
	if fs == nil {
		fs = []any{}
	}
	var b strings.Builder
	write(&b, r, jobj{{"schemaVersion", jint(a.version)}, {"changeId", a.changeID}, {"findings", fs}})
	return b.String()
}

func write(b *strings.Builder, r *rand.Rand, v any) {
	b.WriteString(space(r))
	switch x := v.(type) {
	case jint:
		b.WriteString(spellInt(r, int(x)))
	case jmilli:
		b.WriteString(spellMilli(r, int(x)))
	case string:
		spellString(b, r, x)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			write(b, r, e)
		}
		b.WriteString(space(r) + "]")
	case jobj:
		b.WriteByte('{')
		for i, j := range r.Perm(len(x)) {
			if i > 0 {
				b.WriteByte(',')
			}
			f := x[j]
			if r.IntN(10) == 0 {
				// A decoy before the key's real value: the last one counts.
				spellString(b, r, f.k)
				b.WriteString(space(r) + ":")
				write(b, r, "decoy")
				b.WriteByte(',')
			}
			b.WriteString(space(r))
			spellString(b, r, f.k)
			b.WriteString(space(r) + ":")
			write(b, r, f.v)
		}
		b.WriteString(space(r) + "}")
	}
	b.WriteString(space(r))
}

func space(r *rand.Rand) string {
	return []string{"", "", "", " ", "\n", "\t", "\r\n  "}[r.IntN(7)]
}

// spellInt writes n (not negative) one of the ways JSON allows.
func spellInt(r *rand.Rand, n int) string {
	d := strconv.Itoa(n)
	switch r.IntN(8) {
	case 1:
		return d + ".0"
	case 2:
		return d + "." + strings.Repeat("0", 1+r.IntN(3))
	case 3:
		return d + []string{"e0", "E0", "e+0", "E-0", "e00"}[r.IntN(5)]
	case 4:
		return d + "0e-1"
	case 5:
		return "0." + d + "e" + strconv.Itoa(len(d))
	case 6:
		return d + "00E-2"
	case 7:
		return d + ".0e0"
	}
	return d
}

// spellMilli writes k/1000 (0 to 1000) one of the ways JSON allows.
func spellMilli(r *rand.Rand, k int) string {
	frac := fmt.Sprintf("%d.%03d", k/1000, k%1000)
	switch r.IntN(5) {
	case 1:
		return strconv.Itoa(k) + "e-3"
	case 2:
		return strconv.Itoa(k*10) + "E-4"
	case 3:
		return fmt.Sprintf("0.%04d0e1", k) // k/1000 = 0.0kkk0 × 10
	case 4:
		return strings.TrimSuffix(strings.TrimRight(frac, "0"), ".")
	}
	return frac
}

// spellString writes s as a JSON string, each character raw or escaped
// at random.
func spellString(b *strings.Builder, r *rand.Rand, s string) {
	b.WriteByte('"')
	for _, c := range s {
		short := map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\n': `\n`, '\t': `\t`, '\r': `\r`, '\b': `\b`, '\f': `\f`}[c]
		mustEscape := c == '"' || c == '\\' || c < 0x20
		switch k := r.IntN(4); {
		case k == 0 || (mustEscape && short == ""):
			for _, u := range utf16.Encode([]rune{c}) {
				hex := fmt.Sprintf("%04x", u)
				if r.IntN(2) == 0 {
					hex = strings.ToUpper(hex)
				}
				b.WriteString(`\u` + hex)
			}
		case k == 1 && short != "", mustEscape:
			b.WriteString(short)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
}
