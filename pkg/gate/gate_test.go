package gate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/gate"
)

// reviewDiff touches two files; the login.go hunk covers new lines 10–17,
// the README hunk new lines 1–3.
const reviewDiff = `diff --git a/auth/login.go b/auth/login.go
index 3f1c2aa..9b0e4d1 100644
--- a/auth/login.go
+++ b/auth/login.go
@@ -10,6 +10,8 @@ func Login(u, p string) error {
 	user := find(u)
-	if !check(user, p) {
+	if user != nil && !check(user, p) {
+		log.Printf("login failed for %s with password %s", u, p)
 		return ErrDenied
 	}
+	db.Exec("UPDATE users SET last_login = now() WHERE name = '" + u + "'")
 	return nil
 }
diff --git a/docs/README.md b/docs/README.md
--- a/docs/README.md
+++ b/docs/README.md
@@ -1,2 +1,3 @@
 # Auth
+Login now logs failures.
 See code.
`

var registry = func() *contract.Registry {
	r, err := contract.Load()
	if err != nil {
		panic(err)
	}
	return r
}()

func get(t testing.TB, name string) *contract.Contract {
	t.Helper()
	c, ok := registry.Get(name)
	if !ok {
		t.Fatalf("no contract %q", name)
	}
	return c
}

func input(d string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"diff": d, "title": "Harden login"})
	return b
}

// expect returns what a worker of the named contract saw, all current.
func expect(name string) gate.Expect {
	c, _ := registry.Get(name)
	return gate.Expect{
		WorkID:                 "wrk_01",
		SchemaVersion:          c.SchemaVersion,
		TaxonomyVersion:        c.TaxonomyVersion,
		CurrentTaxonomyVersion: c.TaxonomyVersion,
		Digest:                 "sha256:9f2c",
		CurrentDigest:          "sha256:9f2c",
		Input:                  input(reviewDiff),
	}
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

type obj = map[string]any

func finding(file string, line int, evidence string) obj {
	return obj{"file": file, "line": line, "severity": "blocking", "summary": "Builds SQL from user input.", "evidence": evidence}
}

var (
	sqlFinding = finding("auth/login.go", 15, `db.Exec("UPDATE users SET last_login = now() WHERE name = '" + u + "'")`)
	logFinding = obj{"file": "auth/login.go", "line": 12, "severity": "warning", "summary": "Logs the password in clear text.",
		"evidence": `log.Printf("login failed for %s with password %s", u, p)`}
)

func codeReview(findings ...obj) string {
	if findings == nil {
		findings = []obj{}
	}
	return js(obj{"schemaVersion": 1, "changeId": "wrk_01", "findings": findings})
}

func changeReview(severity string, findings ...obj) string {
	if findings == nil {
		findings = []obj{}
	}
	return js(obj{"schema_version": "change-review.v1", "severity": severity, "tags": []string{"auth", "data-access"}, "findings": findings})
}

func moderation(category string, review bool) string {
	return js(obj{"category": category, "confidence": 0.92, "needsHumanReview": review})
}

type failCase struct {
	name     string
	contract string
	output   string
	expect   func(*gate.Expect)
	code     string
	detail   string // substring of Failure.Detail
}

var failCases = []failCase{
	// syntax
	{name: "too large even if valid", contract: "moderation", output: strings.Repeat(" ", gate.MaxOutputBytes) + moderation("spam", false),
		code: "syntax.too_large", detail: "over the 262144-byte limit"},
	{name: "empty", contract: "moderation", output: " \n", code: "syntax.invalid_json", detail: "output is empty"},
	{name: "prose", contract: "moderation", output: "Sure! Here is the JSON:", code: "syntax.invalid_json", detail: "not JSON"},
	{name: "truncated", contract: "code-review", output: codeReview(sqlFinding)[:60], code: "syntax.invalid_json", detail: "truncated"},
	{name: "invalid utf-8", contract: "moderation", output: `{"category":"spam","x":"` + "\xff" + `"}`, code: "syntax.invalid_encoding", detail: "not valid UTF-8 at byte 24"},
	{name: "overlong encoding", contract: "moderation", output: `{"category":"` + "\xc0\xaf" + `"}`, code: "syntax.invalid_encoding", detail: "at byte 13"},
	{name: "raw NUL", contract: "moderation", output: `{"category":"spam"}` + "\x00", code: "syntax.invalid_encoding", detail: "a NUL byte at byte 19"},
	{name: "escaped NUL", contract: "moderation", output: `{"category":"spam\u0000","confidence":1,"needsHumanReview":false}`, code: "syntax.invalid_encoding", detail: "output.category escapes U+0000"},
	{name: "array", contract: "moderation", output: `[` + moderation("spam", false) + `]`, code: "syntax.not_object", detail: "an array"},
	{name: "null", contract: "moderation", output: `null`, code: "syntax.not_object", detail: "null"},
	{name: "second object", contract: "moderation", output: moderation("spam", false) + "\n" + moderation("abuse", true), code: "syntax.trailing_data", detail: "follow the JSON object"},
	{name: "trailing prose", contract: "moderation", output: moderation("spam", false) + " Hope this helps!", code: "syntax.trailing_data"},

	// schema
	{name: "missing changeId", contract: "code-review", output: `{"schemaVersion":1,"findings":[]}`,
		code: "schema.violation", detail: "output: required: Required property 'changeId' is missing"},
	{name: "severity outside enum", contract: "code-review", output: codeReview(obj{"file": "auth/login.go", "line": 12, "severity": "critical", "summary": "s", "evidence": "log.Printf"}),
		code: "schema.violation", detail: "output.findings[0].severity: enum: "},
	{name: "extra property", contract: "moderation", output: `{"category":"spam","confidence":0.5,"needsHumanReview":false,"reason":"ads"}`,
		code: "schema.violation", detail: "output: additionalProperties: has a property the schema does not allow, named (6 bytes, sha256:"},
	{name: "confidence above 1", contract: "moderation", output: `{"category":"spam","confidence":1.01,"needsHumanReview":false}`,
		code: "schema.violation", detail: "output.confidence: maximum: "},
	{name: "duplicate tags", contract: "change-review", output: `{"schema_version":"change-review.v1","severity":"low","tags":["auth","auth"],"findings":[]}`,
		code: "schema.violation", detail: "output.tags: uniqueItems: "},
	{name: "schema before correlation", contract: "code-review", output: `{"schemaVersion":9,"changeId":"wrk_99","findings":[{}]}`,
		code: "schema.violation", detail: "output.findings[0]: required: "},

	// correlation
	{name: "other work's changeId", contract: "code-review", output: strings.Replace(codeReview(sqlFinding), "wrk_01", "wrk_02", 1),
		code: "correlation.work_id", detail: `changeId (6 bytes, sha256:c943b346) is not the work id wrk_01`},
	{name: "schemaVersion echoed wrong", contract: "code-review", output: strings.Replace(codeReview(), `"schemaVersion":1`, `"schemaVersion":2`, 1),
		code: "correlation.schema_version", detail: `schemaVersion 2 is not the contract's schema version 1`},
	{name: "schemaVersion as the work's internal string", contract: "code-review", output: strings.Replace(codeReview(), `"schemaVersion":1`, `"schemaVersion":"code-review/1"`, 1),
		code: "schema.violation", detail: `output.schemaVersion`},
	{name: "work entered with another schema version", contract: "code-review", output: codeReview(),
		expect: func(e *gate.Expect) { e.SchemaVersion = "code-review/0" },
		code:   "correlation.schema_version", detail: `schema version "code-review/0", the contract is "code-review/1"`},
	{name: "schema_version echoed wrong", contract: "change-review", output: strings.Replace(changeReview("low"), "change-review.v1", "change-review/1", 1),
		code: "correlation.schema_version", detail: `schema_version (17 bytes, sha256:293afe34) is not the contract's schema version "change-review.v1"`},
	{name: "taxonomy changed since claim", contract: "change-review", output: changeReview("low"),
		expect: func(e *gate.Expect) { e.TaxonomyVersion = "2026-10" },
		code:   "correlation.taxonomy_version", detail: `taxonomy version "2026-10" entered the worker, the current one is "2026-11"`},
	{name: "contract taxonomy differs from current", contract: "moderation", output: moderation("spam", false),
		expect: func(e *gate.Expect) { e.TaxonomyVersion, e.CurrentTaxonomyVersion = "2026-12", "2026-12" },
		code:   "correlation.taxonomy_version", detail: `the contract's is "2026-11"`},
	{name: "content changed since claim", contract: "moderation", output: moderation("spam", false),
		expect: func(e *gate.Expect) { e.CurrentDigest = "sha256:77aa" },
		code:   "correlation.digest", detail: `saw content digest "sha256:9f2c", the work's digest is now "sha256:77aa"`},
	{name: "no digest at all", contract: "moderation", output: moderation("spam", false),
		expect: func(e *gate.Expect) { e.Digest, e.CurrentDigest = "", "" },
		code:   "correlation.digest", detail: `the worker saw content digest ""`},
	{name: "correlation before grounding", contract: "code-review", output: strings.Replace(codeReview(finding("nope.go", 1, "x")), "wrk_01", "wrk_02", 1),
		code: "correlation.work_id"},

	// grounding
	{name: "input diff unparsable", contract: "code-review", output: codeReview(sqlFinding),
		expect: func(e *gate.Expect) { e.Input = input("just some text") },
		code:   "grounding.bad_input", detail: "work input diff: "},
	{name: "input without diff", contract: "code-review", output: codeReview(sqlFinding),
		expect: func(e *gate.Expect) { e.Input = json.RawMessage(`{"title":"x"}`) },
		code:   "grounding.bad_input", detail: `no string "diff"`},
	{name: "input missing", contract: "code-review", output: codeReview(),
		expect: func(e *gate.Expect) { e.Input = nil },
		code:   "grounding.bad_input", detail: "work input: "},
	{name: "file not in diff", contract: "code-review", output: codeReview(sqlFinding, finding("auth/session.go", 3, "db.Exec")),
		code: "grounding.file_not_in_diff", detail: `findings[1].file (15 bytes, sha256:a9edf379) is not a file of the diff`},
	{name: "file with git prefix", contract: "code-review", output: codeReview(finding("b/auth/login.go", 15, "db.Exec")),
		code: "grounding.file_not_in_diff", detail: `findings[0].file (15 bytes, sha256:ca1834d2)`},
	{name: "line before hunk", contract: "code-review", output: codeReview(finding("auth/login.go", 9, "db.Exec")),
		code: "grounding.line_outside_hunk", detail: `findings[0].line 9 is outside every changed hunk of findings[0].file`},
	{name: "line after hunk", contract: "code-review", output: codeReview(finding("auth/login.go", 18, "db.Exec")),
		code: "grounding.line_outside_hunk", detail: `findings[0].line 18`},
	{name: "line in another file's hunk", contract: "code-review", output: codeReview(finding("docs/README.md", 12, "Login now logs failures.")),
		code: "grounding.line_outside_hunk", detail: `findings[0].line 12 is outside every changed hunk of findings[0].file`},
	{name: "invented evidence", contract: "code-review", output: codeReview(logFinding, finding("auth/login.go", 15, `db.Query(sql)`)),
		code: "grounding.evidence_not_in_diff", detail: `findings[1].evidence (13 bytes, sha256:4e0b336d) is not text of the diff of findings[1].file`},
	{name: "evidence from another file", contract: "code-review", output: codeReview(finding("auth/login.go", 11, "Login now logs failures.")),
		code: "grounding.evidence_not_in_diff", detail: `findings[0].evidence (24 bytes, sha256:35bc2d9b)`},
	{name: "blank-ish evidence", contract: "code-review", output: codeReview(finding("auth/login.go", 11, "   ")),
		code: "grounding.evidence_not_in_diff"},

	// policy
	{name: "same finding twice", contract: "code-review", output: codeReview(sqlFinding, logFinding, obj{"file": "auth/login.go", "line": 15, "severity": "info",
		"summary": sqlFinding["summary"], "evidence": "db.Exec"}),
		code: "policy.duplicate_finding", detail: `findings[2] repeats findings[0]: the same file, line, code and summary`},
	{name: "same change-review code twice", contract: "change-review", output: changeReview("high",
		obj{"code": "SQL_INJECTION", "severity": "high", "summary": "Builds SQL from user input."},
		obj{"code": "SQL_INJECTION", "severity": "medium", "summary": "Builds SQL from user input."}),
		code: "policy.duplicate_finding", detail: "findings[1] repeats findings[0]"},
	{name: "overall severity below a finding", contract: "change-review", output: changeReview("medium",
		obj{"code": "SQL_INJECTION", "severity": "high", "summary": "Builds SQL from user input."}),
		code: "policy.severity_understated", detail: `severity "medium" is below findings[0].severity "high"`},
	{name: "self harm without review", contract: "moderation", output: moderation("self_harm", false),
		code: "policy.self_harm_needs_review", detail: `category "self_harm" requires needsHumanReview true`},
}

func TestCheckFailures(t *testing.T) {
	for _, tc := range failCases {
		t.Run(tc.name, func(t *testing.T) {
			exp := expect(tc.contract)
			if tc.expect != nil {
				tc.expect(&exp)
			}
			acc, f := gate.Check(get(t, tc.contract), []byte(tc.output), exp)
			if f == nil {
				t.Fatalf("accepted %s", acc.Output)
			}
			if acc != nil {
				t.Fatal("both Accepted and Failure")
			}
			if f.Code != tc.code || !strings.HasPrefix(f.Code, string(f.Stage)+".") {
				t.Fatalf("got %s (stage %s): %s; want %s", f.Code, f.Stage, f.Detail, tc.code)
			}
			if !strings.Contains(f.Detail, tc.detail) {
				t.Fatalf("Detail = %q, want it to contain %q", f.Detail, tc.detail)
			}
			if f.Error() != "gate: "+f.Code+": "+f.Detail {
				t.Fatalf("Error() = %q", f.Error())
			}
		})
	}
}

// TestEveryCodeIsCovered keeps the table honest when a code is added.
func TestEveryCodeIsCovered(t *testing.T) {
	codes := []string{
		gate.CodeTooLarge, gate.CodeInvalidJSON, gate.CodeNotObject, gate.CodeTrailingData,
		gate.CodeSchemaViolation,
		gate.CodeWorkID, gate.CodeSchemaVersion, gate.CodeTaxonomyVersion, gate.CodeDigest,
		gate.CodeBadInput, gate.CodeFileNotInDiff, gate.CodeLineOutsideHunk, gate.CodeEvidenceNotInDiff,
		gate.CodeDuplicateFinding, gate.CodeSeverityUnderstated, gate.CodeSelfHarmNeedsHuman,
	}
	seen := map[string]bool{}
	for _, tc := range failCases {
		seen[tc.code] = true
	}
	for _, c := range codes {
		if !seen[c] {
			t.Errorf("no test case for %s", c)
		}
	}
}

func TestNoContract(t *testing.T) {
	_, f := gate.Check(nil, []byte(`{}`), gate.Expect{})
	if f == nil || f.Code != gate.CodeNoContract {
		t.Fatalf("Check(nil) = %v", f)
	}
}

func TestCheckAccepts(t *testing.T) {
	cases := []acceptCase{
		{"code-review with findings", "code-review", codeReview(sqlFinding, logFinding), nil, 2},
		{"code-review, nothing found", "code-review", codeReview(), nil, 0},
		{"code-review, evidence on a context line", "code-review", codeReview(finding("auth/login.go", 13, "return ErrDenied")), nil, 1},
		{"code-review, multi-line evidence", "code-review",
			codeReview(finding("auth/login.go", 11, "if user != nil && !check(user, p) {\n\t\tlog.Printf(\"login failed for %s with password %s\", u, p)")), nil, 1},
		{"code-review, line as 1.5e1", "code-review", strings.Replace(codeReview(sqlFinding), `"line":15`, `"line":1.5e1`, 1), nil, 1},
		{"code-review, schemaVersion as 1.0", "code-review", strings.Replace(codeReview(sqlFinding), `"schemaVersion":1`, `"schemaVersion":1.0`, 1), nil, 1},
		{"code-review, second file", "code-review", codeReview(finding("docs/README.md", 2, "Login now logs failures.")), nil, 1},
		{"change-review", "change-review", changeReview("high",
			obj{"code": "SQL_INJECTION", "severity": "high", "summary": "Builds SQL from user input."},
			obj{"code": "SECRET_IN_LOG", "severity": "medium", "summary": "Logs the password."}), nil, 2},
		{"change-review, grounding does not apply", "change-review", changeReview("low"),
			func(e *gate.Expect) { e.Input = json.RawMessage(`{"diff":"not a diff"}`) }, 0},
		{"moderation", "moderation", moderation("spam", false), func(e *gate.Expect) { e.Input = nil }, 0},
		{"moderation, self harm reviewed", "moderation", moderation("self_harm", true), nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exp := expect(tc.contract)
			if tc.expect != nil {
				tc.expect(&exp)
			}
			acc, f := gate.Check(get(t, tc.contract), []byte(tc.output), exp)
			if f != nil {
				t.Fatalf("refused: %v", f)
			}
			if len(acc.Findings) != tc.findings {
				t.Errorf("Findings = %d, want %d", len(acc.Findings), tc.findings)
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, acc.Output); err != nil || !bytes.Equal(compact.Bytes(), acc.Output) ||
				!reflect.DeepEqual(decodeNumbers(t, acc.Output), decodeNumbers(t, []byte(tc.canonical()))) {
				t.Errorf("Output %s is not a compact encoding of %s", acc.Output, tc.output)
			}
			if !reflect.DeepEqual(decodeNumbers(t, acc.Output), any(acc.Doc)) {
				t.Errorf("Output %s is not an encoding of Doc %v", acc.Output, acc.Doc)
			}
		})
	}
}

type acceptCase struct {
	name, contract, output string
	expect                 func(*gate.Expect)
	findings               int
}

// canonical is the case's output as the gate stores it: its numbers in
// their canonical spelling.
func (tc acceptCase) canonical() string {
	return strings.NewReplacer(`"line":1.5e1`, `"line":15`, `"schemaVersion":1.0`, `"schemaVersion":1`).Replace(tc.output)
}

func decodeNumbers(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAcceptedOutputIsWhatWasChecked(t *testing.T) {
	// Whitespace goes, duplicate keys resolve to the value that was validated,
	// numbers take their canonical spelling and HTML is not escaped.
	out := "{\n  \"needsHumanReview\": true, \"category\": \"spam\",\n  \"confidence\": 0.50, \"category\": \"abuse\"\n}\n"
	acc, f := gate.Check(get(t, "moderation"), []byte(out), expect("moderation"))
	if f != nil {
		t.Fatal(f)
	}
	if got, want := string(acc.Output), `{"category":"abuse","confidence":0.5,"needsHumanReview":true}`; got != want {
		t.Fatalf("Output = %s, want %s", got, want)
	}
	acc, f = gate.Check(get(t, "code-review"), []byte(codeReview(finding("auth/login.go", 15, `u + "'"`))), expect("code-review"))
	if f != nil {
		t.Fatal(f)
	}
	if !bytes.Contains(acc.Output, []byte(`u + \"'\"`)) || bytes.Contains(acc.Output, []byte(`\u0026`)) {
		t.Fatalf("Output = %s", acc.Output)
	}
}

func TestDetailIsBounded(t *testing.T) {
	long := strings.Repeat("x", 1000)
	_, f := gate.Check(get(t, "code-review"), []byte(codeReview(finding("auth/login.go", 15, long))), expect("code-review"))
	if f == nil || f.Code != gate.CodeEvidenceNotInDiff || len(f.Detail) > 300 {
		t.Fatalf("got %v", f)
	}
}

func FuzzCheck(f *testing.F) {
	for _, tc := range failCases {
		if len(tc.output) < 4096 {
			f.Add([]byte(tc.output))
		}
	}
	f.Add([]byte(codeReview(sqlFinding, logFinding)))
	f.Add([]byte(changeReview("high", obj{"code": "A", "severity": "low", "summary": "s"})))
	f.Add([]byte(moderation("self_harm", true)))
	f.Add([]byte(`{"findings":[{"line":1e400}]}`))
	f.Add([]byte(`{"a":[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]}`))
	names := registry.Names()
	f.Fuzz(func(t *testing.T, output []byte) {
		for _, name := range names {
			c := get(t, name)
			exp := expect(name)
			acc, fl := gate.Check(c, output, exp)
			if (acc == nil) == (fl == nil) {
				t.Fatalf("%s: Accepted %v and Failure %v", name, acc, fl)
			}
			if fl != nil {
				if !strings.HasPrefix(fl.Code, string(fl.Stage)+".") || fl.Detail == "" {
					t.Fatalf("%s: malformed failure %+v", name, fl)
				}
				continue
			}
			// What was accepted must pass again unchanged.
			again, fl := gate.Check(c, acc.Output, exp)
			if fl != nil || !bytes.Equal(again.Output, acc.Output) || !reflect.DeepEqual(again.Findings, acc.Findings) {
				t.Fatalf("%s: accepted %s but its re-check gave %v", name, acc.Output, fl)
			}
			// And every reader reads it as the gate did.
			if read, err := gate.Read(acc.Output); err != nil || !reflect.DeepEqual(read, acc) {
				t.Fatalf("%s: accepted %s but Read gave %+v, %v", name, acc.Output, read, err)
			}
		}
	})
}

func ExampleCheck() {
	reg, err := contract.Load()
	if err != nil {
		panic(err)
	}
	c, _ := reg.Get("code-review")
	in, _ := json.Marshal(map[string]string{"diff": reviewDiff})
	output := `{"schemaVersion":1,"changeId":"wrk_01","findings":[
	  {"file":"auth/session.go","line":14,"severity":"blocking","summary":"Session never expires.","evidence":"ttl := 0"}]}`

	_, f := gate.Check(c, []byte(output), gate.Expect{
		WorkID: "wrk_01", SchemaVersion: "code-review/1",
		TaxonomyVersion: "2026-11", CurrentTaxonomyVersion: "2026-11",
		Digest: "sha256:9f2c", CurrentDigest: "sha256:9f2c",
		Input: in,
	})
	fmt.Println(f.Stage)
	fmt.Println(f.Code)
	fmt.Println(f.Detail)
	// Output:
	// grounding
	// grounding.file_not_in_diff
	// findings[0].file (15 bytes, sha256:a9edf379) is not a file of the diff
}
