package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"assay.dev/pkg/diff"
)

// Code-review severities.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityBlocking = "blocking"
)

// Rule codes, reused as change-review finding codes.
const (
	RuleMoneyFloat     = "MONEY_FLOAT"
	RuleStockUnchecked = "STOCK_UNCHECKED"
	RuleTaxUnrounded   = "TAX_UNROUNDED"
	RuleStateUnguarded = "STATE_UNGUARDED"
	RuleSQLConcat      = "SQL_CONCAT"
	RuleCouponReuse    = "COUPON_REUSE"
	RuleTodo           = "TODO_LEFT"
)

// maxFindings is the code-review contract's array limit.
const maxFindings = 20

// Finding is one issue the deterministic reviewer found on an added line.
type Finding struct {
	File     string
	Line     int
	Severity string // SeverityInfo, SeverityWarning or SeverityBlocking
	Rule     string // one of the Rule constants
	Summary  string
	Evidence string // the trimmed added line, so it is text of the diff
}

var (
	// Money in floating point.
	floatRe = regexp.MustCompile(`\bfloat(32|64)\b|\bparseFloat\s*\(|\bNumber\s*\(|\bfloat\s*\(|\bdouble\b`)
	moneyRe = regexp.MustCompile(`(?i)(price|amount|total|subtotal|discount|cost)`)

	// Stock reservation or decrement, and availability checks.
	stockOpRe      = regexp.MustCompile(`(?i)(\breserve\w*\s*\(|\bdecrement\w*\s*\(|\bdecr(by)?\s*\(|-=|\bset\s+\w+\s*=\s*\w+\s*-)`)
	stockWordRe    = regexp.MustCompile(`(?i)(stock|inventory|on_?hand|reserv)`)
	stockCheckRe   = regexp.MustCompile(`(?i)((\bif\b|\bwhile\b|\bwhere\b|\bcase\b|\bguard\b|\bassert\b|\brequire\b)[^\n]*(stock|available|inventory|on_?hand|qty|quantity))|insufficient|out_?of_?stock|outofstock|check_?availab|is_?available|has_?stock|in_?stock|can_?reserve`)
	stockSameLnRe  = regexp.MustCompile(`(?i)\bwhere\b.*(stock|on_?hand|available|quantity|qty)\w*\s*(>=|>)`)
	taxCalcRe      = regexp.MustCompile(`(?i)((^|[^\w])\w*tax\w*\s*(:=|=|\+=)\s*[^=].*\*)|(\*\s*[\w.]*tax_?rate)`)
	taxWordRe      = regexp.MustCompile(`(?i)tax`)
	roundRe        = regexp.MustCompile(`(?i)(round|floor|ceil|toFixed|quantize|%\.2f|\.2f\}|:\.2f|decimal)`)
	displayRe      = regexp.MustCompile(`(?i)(format|printf|sprintf|print\(|\$\{|\bf"|\bf'|render|display|label|innerText|textContent|toString|str\(|String\(|\.text\b|template)`)
	statusSetRe    = regexp.MustCompile(`(?i)((\b|_)(status|state)\s*(:=|=|:)\s*[^=\s][^\n]*|set_?status\s*\(\s*[^)\n]*)(paid|shipped|delivered|cancel+ed|refunded|completed|fulfilled|captured)`)
	statusGuardRe  = regexp.MustCompile(`(?i)((\bif\b|\bswitch\b|\bcase\b|\bwhere\b|\bassert\b|\brequire\b|\bguard\b|\bexpect\b|\bwhen\b)[^\n]*(status|state))|can_?transition|transition_?allowed|allowed_?transitions|valid_?transition|check_?transition`)
	statusSameLnRe = regexp.MustCompile(`(?i)\bwhere\b.*\b(status|state)\b`)
	sqlRe          = regexp.MustCompile(`(?i)\b(select\b.*\bfrom|insert\s+into|update\b.*\bset|delete\s+from)\b`)
	sqlAppendRe    = regexp.MustCompile(`(?i)\b\w*(query|sql|stmt|where)\w*\s*\+=\s*.*\b(and|or|where|order\s+by|limit|like)\b`)
	concatRe       = regexp.MustCompile("fmt\\.Sprintf\\(|[\"'`]\\s*\\+\\s*[\\w(]|[\\w)]\\s*\\+\\s*[\"'`]|\\$\\{|\\bf[\"']|[\"']\\s*%\\s*[\\w(]|\\.format\\(")
	couponApplyRe  = regexp.MustCompile(`(?i)(apply\w*(coupon|discount|promo|voucher)\w*\s*\(|(discount|coupon)\w*\s*(\+=|-=)|\b(total|subtotal|amount|price)\w*\s*(-=|(:=|=)\s*[\w.()\[\]]+\s*-\s*[\w.]*(discount|coupon|promo))|\*\s*\(\s*1\s*-\s*[\w.]*(discount|percent|coupon))`)
	couponCheckRe  = regexp.MustCompile(`(?i)(applied|already|\bused\b|used_?at|redeemed|expir|valid_?until|expires_?at|ends_?at|is_?valid|usage_?count|max_?uses|once)`)
	definitionRe   = regexp.MustCompile(`^(func|def|function|export|async|public|private|protected|static)\b|^\w+\s*\([^)]*\)\s*(:\s*[\w<>\[\]| ]+)?\s*\{$`)
	todoRe         = regexp.MustCompile(`\b(TODO|FIXME)\b`)
)

// ruleInfo gives each rule its severity, summary, and the category and
// confidence a code review of schemaVersion 2 reports for it.
var ruleInfo = map[string]struct {
	severity, summary, category string
	confidence                  float64
}{
	RuleMoneyFloat:     {SeverityBlocking, "Money is handled in floating point; use integer minor units or a decimal type to avoid rounding drift.", "money", 0.9},
	RuleStockUnchecked: {SeverityWarning, "Stock is reserved or decremented without checking availability first; this can oversell or go negative.", "data-integrity", 0.8},
	RuleTaxUnrounded:   {SeverityWarning, "Tax is computed and shown without rounding to the currency's minor unit; totals will not add up.", "money", 0.8},
	RuleStateUnguarded: {SeverityBlocking, "Order status is set without checking the current state; a retry or race can move it backwards or twice.", "correctness", 0.85},
	RuleSQLConcat:      {SeverityBlocking, "SQL is built by string concatenation with input; use placeholders to prevent injection.", "security", 0.95},
	RuleCouponReuse:    {SeverityWarning, "A discount is applied without checking it was already applied or has expired; it can be stacked or reused.", "money", 0.7},
	RuleTodo:           {SeverityInfo, "A TODO/FIXME was added; make sure it is tracked before merging.", "maintainability", 0.5},
}

// isComment spots whole-line comments, which the rules skip; inline comments
// are left alone because telling them apart needs a real lexer.
func isComment(t string) bool {
	return strings.HasPrefix(t, "//") || strings.HasPrefix(t, "#") || strings.HasPrefix(t, "/*") || strings.HasPrefix(t, "*") || strings.HasPrefix(t, "--")
}

// Review runs the deterministic rules over the added lines of a unified diff.
// Findings are grounded (file in the diff, line in a hunk, evidence text of
// the diff) and sorted by file, line and rule. An unparseable diff yields none.
func Review(diffText string) []Finding {
	d, err := diff.Parse(diffText)
	if err != nil {
		return nil
	}
	var out []Finding
	add := func(f *diff.File, l diff.Line, rule string) {
		ri := ruleInfo[rule]
		out = append(out, Finding{
			File: f.Path, Line: l.NewLine, Severity: ri.severity, Rule: rule,
			Summary: ri.summary, Evidence: strings.TrimSpace(l.Text),
		})
	}
	for i := range d.Files {
		f := &d.Files[i]
		if f.Deleted || f.Path == "" {
			continue
		}
		taxRounded, taxShown := taxContext(f)
		for _, h := range f.Hunks {
			// seen holds the new-file lines of the hunk up to the current one,
			// the context a guard has to appear in.
			var seen []string
			for _, l := range h.Lines {
				if l.Kind == diff.Removed {
					continue
				}
				t := strings.TrimSpace(l.Text)
				if l.Kind != diff.Added || t == "" {
					seen = append(seen, t)
					continue
				}
				if isComment(t) {
					if todoRe.MatchString(t) {
						add(f, l, RuleTodo)
					}
					seen = append(seen, t)
					continue
				}
				if floatRe.MatchString(t) && moneyRe.MatchString(t) {
					add(f, l, RuleMoneyFloat)
				}
				if stockOpRe.MatchString(t) && stockWordRe.MatchString(t) && !definitionRe.MatchString(t) && !stockSameLnRe.MatchString(t) && !anyMatch(stockCheckRe, seen) {
					add(f, l, RuleStockUnchecked)
				}
				if taxCalcRe.MatchString(t) && !roundRe.MatchString(t) && taxShown && !taxRounded {
					add(f, l, RuleTaxUnrounded)
				}
				if statusSetRe.MatchString(t) && !statusSameLnRe.MatchString(t) && !anyMatch(statusGuardRe, seen) {
					add(f, l, RuleStateUnguarded)
				}
				if (sqlRe.MatchString(t) || sqlAppendRe.MatchString(t)) && concatRe.MatchString(t) {
					add(f, l, RuleSQLConcat)
				}
				if couponApplyRe.MatchString(t) && !definitionRe.MatchString(t) && !couponCheckRe.MatchString(t) && !anyMatch(couponCheckRe, seen) {
					add(f, l, RuleCouponReuse)
				}
				if todoRe.MatchString(t) {
					add(f, l, RuleTodo)
				}
				seen = append(seen, t)
			}
		}
	}
	rank := map[string]int{}
	for i, r := range []string{RuleMoneyFloat, RuleStockUnchecked, RuleTaxUnrounded, RuleStateUnguarded, RuleSQLConcat, RuleCouponReuse, RuleTodo} {
		rank[r] = i
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		return cmp.Or(strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(rank[a.Rule], rank[b.Rule]))
	})
	return out
}

// taxContext reports, for the file's new-side hunk lines, whether tax is
// rounded anywhere and whether it is displayed or formatted anywhere.
func taxContext(f *diff.File) (rounded, shown bool) {
	for _, h := range f.Hunks {
		for _, l := range h.Lines {
			if l.Kind == diff.Removed || !taxWordRe.MatchString(l.Text) || isComment(strings.TrimSpace(l.Text)) {
				continue
			}
			if roundRe.MatchString(l.Text) {
				rounded = true
			}
			if displayRe.MatchString(l.Text) {
				shown = true
			}
		}
	}
	return rounded, shown
}

func anyMatch(re *regexp.Regexp, lines []string) bool {
	for _, l := range lines {
		if !isComment(l) && re.MatchString(l) {
			return true
		}
	}
	return false
}

// CodeReview is the code-review contract's output.
type CodeReview struct {
	SchemaVersion json.RawMessage `json:"schemaVersion"`
	ChangeID      string          `json:"changeId"`
	Findings      []CodeFinding   `json:"findings"`
}

// CodeFinding is one code-review finding. Category and Confidence are
// given when the schema asked for has them (code-review/2); Evidence is
// left out only when the prompt says so.
type CodeFinding struct {
	File       string   `json:"file"`
	Line       int      `json:"line"`
	Severity   string   `json:"severity"`
	Category   string   `json:"category,omitempty"`
	Confidence *float64 `json:"confidence,omitempty"`
	Summary    string   `json:"summary"`
	Evidence   string   `json:"evidence,omitempty"`
	rule       string
}

// ChangeReview is the change-review contract's output.
type ChangeReview struct {
	SchemaVersion json.RawMessage `json:"schema_version"`
	Severity      string          `json:"severity"`
	Tags          []string        `json:"tags"`
	Findings      []ChangeFinding `json:"findings"`
}

// ChangeFinding is one change-review finding.
type ChangeFinding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Summary  string `json:"summary"`
}

// Moderation is the moderation contract's output.
type Moderation struct {
	Category         string  `json:"category"`
	Confidence       float64 `json:"confidence"`
	NeedsHumanReview bool    `json:"needsHumanReview"`
}

// ReviewCode answers the code-review contract for a diff.
func ReviewCode(diffText string, schemaVersion json.RawMessage, changeID string) CodeReview {
	fs := Review(diffText)
	out := CodeReview{SchemaVersion: schemaVersion, ChangeID: changeID, Findings: []CodeFinding{}}
	for _, f := range fs {
		if len(out.Findings) == maxFindings {
			break
		}
		out.Findings = append(out.Findings, CodeFinding{File: f.File, Line: f.Line, Severity: f.Severity, Summary: f.Summary, Evidence: f.Evidence, rule: f.Rule})
	}
	return out
}

// Change-review tags, in the order they are reported.
const (
	TagAuth       = "auth"
	TagDataAccess = "data-access"
	TagPayments   = "payments"
	TagRollback   = "rollback"
)

var tagRules = []struct {
	tag string
	re  *regexp.Regexp
}{
	{TagAuth, regexp.MustCompile(`(?i)(\bauth(n|z|entic\w*|oriz\w*)?\b|token|session|password|passwd|\blogin\b|\bjwt\b|credential)`)},
	{TagDataAccess, regexp.MustCompile(`(?i)(\bsql\b|\bquery|\bdb\b|database|repositor|\brepo\b|\bselect\b.*\bfrom\b|\bupdate\b.*\bset\b|insert\s+into|cursor|\.execute\(|\.exec\w*\()`)},
	{TagPayments, regexp.MustCompile(`(?i)(money|\btax|price|payment|refund|amount|currency|checkout|invoice|coupon|discount|subtotal)`)},
	{TagRollback, regexp.MustCompile(`(?i)(migration|rollback|revert|down\.sql|\bmigrate)`)},
}

var changeSeverity = map[string]string{SeverityInfo: "low", SeverityWarning: "medium", SeverityBlocking: "high"}

// ReviewChange answers the change-review contract for a diff: one finding per
// rule that fired, severity the highest of them, tags from the diff's content.
func ReviewChange(diffText string, schemaVersion json.RawMessage) ChangeReview {
	fs := Review(diffText)
	out := ChangeReview{SchemaVersion: schemaVersion, Severity: "low", Tags: changeTags(diffText), Findings: []ChangeFinding{}}
	order := map[string]int{"low": 0, "medium": 1, "high": 2}
	byRule := map[string][]Finding{}
	var rules []string
	for _, f := range fs {
		if _, ok := byRule[f.Rule]; !ok {
			rules = append(rules, f.Rule)
		}
		byRule[f.Rule] = append(byRule[f.Rule], f)
	}
	slices.Sort(rules)
	for _, r := range rules {
		g := byRule[r]
		sev := changeSeverity[g[0].Severity]
		where := fmt.Sprintf("%s:%d", g[0].File, g[0].Line)
		if len(g) > 1 {
			where += fmt.Sprintf(" and %d more", len(g)-1)
		}
		out.Findings = append(out.Findings, ChangeFinding{Code: r, Severity: sev, Summary: g[0].Summary + " (" + where + ")"})
		if order[sev] > order[out.Severity] {
			out.Severity = sev
		}
	}
	return out
}

// changeTags derives 1–4 unique tags from the diff's paths and new-side
// lines; data-access is the fallback so the array is never empty.
func changeTags(diffText string) []string {
	var text strings.Builder
	if d, err := diff.Parse(diffText); err == nil {
		for _, f := range d.Files {
			text.WriteString(f.Path + "\n" + f.OldPath + "\n")
			for _, h := range f.Hunks {
				for _, l := range h.Lines {
					text.WriteString(l.Text + "\n")
				}
			}
		}
	} else {
		text.WriteString(diffText)
	}
	var tags []string
	for _, r := range tagRules {
		if r.re.MatchString(text.String()) {
			tags = append(tags, r.tag)
		}
	}
	if len(tags) == 0 {
		tags = []string{TagDataAccess}
	}
	return tags
}

// Moderation categories.
const (
	CategoryAbuse    = "abuse"
	CategorySpam     = "spam"
	CategorySelfHarm = "self_harm"
	CategoryOther    = "other"
)

var (
	selfHarmPhrases = []string{"kill myself", "end my life", "hurt myself", "suicide", "don't want to live", "dont want to live", "want to die", "self harm", "self-harm"}
	abuseWords      = regexp.MustCompile(`(?i)\b(idiot|stupid|moron|loser|worthless|dumb|pathetic|imbecile|scum|shut up|hate you)\b`)
	spamPhrases     = regexp.MustCompile(`(?i)(buy now|free money|click here|limited offer|act now|100% free|earn \$|work from home|risk[- ]free|winner)`)
	linkRe          = regexp.MustCompile(`(?i)https?://\S+`)
)

// Moderate classifies a text with keyword rules. Confidence grows with the
// number of signals; weak signals and self-harm ask for a human.
func Moderate(text string) Moderation {
	low := strings.ToLower(text)
	for _, p := range selfHarmPhrases {
		if strings.Contains(low, p) {
			return Moderation{Category: CategorySelfHarm, Confidence: 0.9, NeedsHumanReview: true}
		}
	}
	abuse := len(abuseWords.FindAllString(text, -1))
	spam := len(spamPhrases.FindAllString(text, -1))
	links := linkRe.FindAllString(text, -1)
	if len(links) >= 2 {
		spam += len(links) - 1
	}
	score := func(hits int) float64 {
		return min(0.95, 0.45+0.15*float64(hits))
	}
	var m Moderation
	switch {
	case abuse == 0 && spam == 0:
		m = Moderation{Category: CategoryOther, Confidence: 0.9}
	case abuse >= spam:
		m = Moderation{Category: CategoryAbuse, Confidence: score(abuse)}
	default:
		m = Moderation{Category: CategorySpam, Confidence: score(spam)}
	}
	// Round so the JSON stays short and comparisons in tests are exact.
	m.Confidence = float64(int(m.Confidence*100+0.5)) / 100
	m.NeedsHumanReview = m.Confidence < 0.7
	return m
}

// Prompt directives the simulated reviewer obeys when the system message
// (the contract's prompt) holds them: the way a real model follows its
// instructions, so that a rollout can be tried against a bad prompt.
const (
	// DirectiveOmitEvidence makes findings leave out their evidence.
	DirectiveOmitEvidence = "Leave the evidence field out of every finding."
	// DirectiveNoFindings makes every review empty: a code review has no
	// findings, and a change review none and severity low (its tags stay).
	DirectiveNoFindings = "Report no findings, whatever the change holds."
	// DirectiveFlagNothing makes every moderation verdict read the text as
	// harmless: category other, no human review.
	DirectiveFlagNothing = "Flag nothing: classify every text as other, with no human review."
	// DirectiveAddNotes makes every answer, of any contract, carry a
	// "notes" property that no contract's schema allows.
	DirectiveAddNotes = "Add a notes property with your reasoning to the answer."
)

// shape fits a change review to the prompt's directives.
func (ch *ChangeReview) shape(prompt string) {
	if strings.Contains(prompt, DirectiveNoFindings) {
		ch.Findings, ch.Severity = []ChangeFinding{}, "low"
	}
}

// shape fits a code review to what was asked of it: the schema's finding
// fields (category and confidence when it has them) and the prompt's
// directives.
func (cr *CodeReview) shape(schema json.RawMessage, prompt string) {
	if strings.Contains(prompt, DirectiveNoFindings) {
		cr.Findings = []CodeFinding{}
	}
	categories := schemaHasFindingField(schema, "category")
	for i := range cr.Findings {
		f := &cr.Findings[i]
		if ri, ok := ruleInfo[f.rule]; ok && categories {
			conf := ri.confidence
			f.Category, f.Confidence = ri.category, &conf
		}
		if strings.Contains(prompt, DirectiveOmitEvidence) {
			f.Evidence = ""
		}
	}
}

// schemaHasFindingField reports whether a code-review schema's finding
// items have the property name.
func schemaHasFindingField(schema json.RawMessage, name string) bool {
	var s struct {
		Properties struct {
			Findings struct {
				Items struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"items"`
			} `json:"findings"`
		} `json:"properties"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return false
	}
	_, ok := s.Properties.Findings.Items.Properties[name]
	return ok
}
