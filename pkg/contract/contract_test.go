package contract

import (
	"encoding/json"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"assay.dev/schemas"
)

const sampleDiff = `diff --git a/auth/login.go b/auth/login.go
--- a/auth/login.go
+++ b/auth/login.go
@@ -10,3 +10,4 @@ func Login(u, p string) error {
 	user := find(u)
-	if !check(user, p) {
+	if user != nil && !check(user, p) {
+		log.Printf("password %s", p)
 		return ErrDenied
`

func mustLoad(t testing.TB) *Registry {
	t.Helper()
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustGet(t testing.TB, r *Registry, name string) *Contract {
	t.Helper()
	c, ok := r.Get(name)
	if !ok {
		t.Fatalf("no contract %q", name)
	}
	return c
}

func TestLoad(t *testing.T) {
	r := mustLoad(t)
	if got, want := r.Names(), []string{"change-review", "code-review", "moderation"}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	if _, ok := r.Get("nope"); ok {
		t.Fatal("Get(nope) found a contract")
	}
	want := map[string]struct{ version, workID, schemaVersion, wire, grounding string }{
		"code-review":   {"code-review/1", "changeId", "schemaVersion", `1`, "diff"},
		"change-review": {"change-review/1", "", "schema_version", `"change-review.v1"`, ""},
		"moderation":    {"moderation/1", "", "", `"moderation/1"`, ""},
	}
	for name, w := range want {
		c := mustGet(t, r, name)
		file, err := fs.ReadFile(schemas.FS, name+".json")
		if err != nil {
			t.Fatal(err)
		}
		if string(c.Schema) != string(file) {
			t.Errorf("%s: Schema is not the file's bytes verbatim", name)
		}
		if c.SchemaVersion != w.version || c.TaxonomyVersion != "2026-11" ||
			c.Correlation.WorkID != w.workID || c.Correlation.SchemaVersion != w.schemaVersion || c.Grounding != w.grounding ||
			string(c.WireSchemaVersion) != w.wire {
			t.Errorf("%s: got %+v", name, c)
		}
		if !strings.Contains(c.Prompt, "untrusted") {
			t.Errorf("%s: prompt does not warn that the input is untrusted", name)
		}
	}
}

func TestNamesIsACopy(t *testing.T) {
	r := mustLoad(t)
	r.Names()[0] = "x"
	if r.Names()[0] == "x" {
		t.Fatal("Names exposes the registry's slice")
	}
}

func validFS() fstest.MapFS {
	m := fstest.MapFS{}
	_ = fs.WalkDir(schemas.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(schemas.FS, p)
			m[p] = &fstest.MapFile{Data: b}
		}
		return err
	})
	return m
}

func TestLoadRefusesBrokenContracts(t *testing.T) {
	const objStart = `{"type":"object","additionalProperties":false,"required":["a"],"properties":{"a":`
	cases := []struct {
		name   string
		mutate func(fstest.MapFS)
		want   string
	}{
		{"no manifest", func(m fstest.MapFS) { delete(m, "contracts.json") }, "contracts.json"},
		{"manifest not json", func(m fstest.MapFS) { m["contracts.json"].Data = []byte("[") }, "contracts.json"},
		{"manifest unknown field", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"grounding"`, `"grnding"`, 1))
		}, "contracts.json"},
		{"missing schema file", func(m fstest.MapFS) { delete(m, "moderation.json") }, "moderation.json"},
		{"missing prompt", func(m fstest.MapFS) { delete(m, "prompts/moderation.txt") }, "prompts/moderation.txt"},
		{"schema not json", func(m fstest.MapFS) { m["moderation.json"].Data = []byte("{") }, "moderation.json"},
		{"misspelt keyword", func(m fstest.MapFS) {
			m["moderation.json"].Data = []byte(objStart + `{"type":"string","maxlength":3}}}`)
		}, `moderation.json: #/properties/a: keyword "maxlength"`},
		{"open object", func(m fstest.MapFS) {
			m["moderation.json"].Data = []byte(`{"type":"object","required":[],"properties":{}}`)
		}, `moderation.json: #: object without "additionalProperties": false`},
		{"optional property in output", func(m fstest.MapFS) {
			m["moderation.json"].Data = []byte(`{"type":"object","additionalProperties":false,"required":[],"properties":{"a":{"type":"string"}}}`)
		}, "moderation.json: #: strict output needs every property"},
		{"bad pattern", func(m fstest.MapFS) {
			m["moderation.json"].Data = []byte(objStart + `{"type":"string","pattern":"("}}}`)
		}, "moderation.json: compile"},
		{"correlation field missing", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"schemaVersion": "schema_version"`, `"schemaVersion": "schemaVersion"`, 1))
		}, `change-review.json: correlation field "schemaVersion"`},
		{"a version under another name", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"name": "moderation"`, `"name": "code-review"`, 1))
		}, `schemaVersion "moderation/1" is not "code-review/" and a version`},
		{"duplicate version", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"schemaVersion": "code-review/2"`, `"schemaVersion": "code-review/1"`, 1))
		}, `duplicate schemaVersion "code-review/1"`},
		{"two defaults", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"bytesPerUnit": 3}}`, `"bytesPerUnit": 3}, "default": true}`, 1))
		}, `"code-review" has 2 default versions`},
		{"no default of several", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `, "default": true`, ``, 1))
		}, `"code-review" has 2 versions and none is the default`},
		{"parts of an ungrounded contract", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"grounding": ""}`, `"grounding": "", "parts": {"units": 100}}`, 1))
		}, `only a contract grounded in a diff`},
		{"negative part size", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"units": 12000`, `"units": -1`, 1))
		}, `must not be negative`},
		{"negative cost cap", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"default": true}`, `"default": true, "costCapMicros": -5}`, 1))
		}, `costCapMicros -5 is negative`},
		{"unknown grounding", func(m fstest.MapFS) {
			m["contracts.json"].Data = []byte(strings.Replace(string(m["contracts.json"].Data), `"grounding": "diff"`, `"grounding": "repo"`, 1))
		}, `grounding "repo"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := validFS()
			tc.mutate(m)
			_, err := load(m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("load() error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := load(validFS()); err != nil {
		t.Fatalf("unmodified copy: %v", err)
	}
}

func decode(t testing.TB, s string) any {
	t.Helper()
	v, err := DecodeObject([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const validCodeReview = `{"schemaVersion":1,"changeId":"w1","findings":[
 {"file":"auth/login.go","line":12,"severity":"blocking","summary":"Logs the password.","evidence":"log.Printf(\"password %s\", p)"}]}`

// TestValidateOutputKeywords proves that each keyword the contracts rely on
// is enforced by the library, not just accepted.
func TestValidateOutputKeywords(t *testing.T) {
	r := mustLoad(t)
	cases := []struct {
		contract, doc, field, keyword string
	}{
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[],"extra":1}`, "output", "additionalProperties"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"a","line":1,"severity":"info","summary":"s","evidence":"e","x":true}]}`, "output.findings[0]", "additionalProperties"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"a","line":1,"severity":"fatal","summary":"s","evidence":"e"}]}`, "output.findings[0].severity", "enum"},
		{"code-review", `{"schemaVersion":1,"findings":[]}`, "output", "required"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"a","line":1,"severity":"info","summary":"s"}]}`, "output.findings[0]", "required"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"a","line":0,"severity":"info","summary":"s","evidence":"e"}]}`, "output.findings[0].line", "minimum"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"a","line":1.5,"severity":"info","summary":"s","evidence":"e"}]}`, "output.findings[0].line", "type"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"","line":1,"severity":"info","summary":"s","evidence":"e"}]}`, "output.findings[0].file", "minLength"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":[{"file":"` + strings.Repeat("é", 401) + `","line":1,"severity":"info","summary":"s","evidence":"e"}]}`, "output.findings[0].file", "maxLength"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":` + findings(21) + `}`, "output.findings", "maxItems"},
		{"code-review", `{"schemaVersion":1,"changeId":42,"findings":[]}`, "output.changeId", "type"},
		{"code-review", `{"schemaVersion":1,"changeId":"w1","findings":{}}`, "output.findings", "type"},
		{"code-review", `[]`, "output", "type"},
		{"change-review", `{"schema_version":"change-review.v1","severity":"low","tags":["auth","auth"],"findings":[]}`, "output.tags", "uniqueItems"},
		{"change-review", `{"schema_version":"change-review.v1","severity":"low","tags":[],"findings":[]}`, "output.tags", "minItems"},
		{"change-review", `{"schema_version":"change-review.v1","severity":"low","tags":["auth","data-access","payments","rollback","auth"],"findings":[]}`, "output.tags", "maxItems"},
		{"change-review", `{"schema_version":"change-review.v1","severity":"low","tags":["billing"],"findings":[]}`, "output.tags[0]", "enum"},
		{"change-review", `{"schema_version":"change-review.v1","severity":"low","tags":["auth"],"findings":[{"code":"bad-code","severity":"low","summary":"s"}]}`, "output.findings[0].code", "pattern"},
		{"moderation", `{"category":"spam","confidence":1.5,"needsHumanReview":false}`, "output.confidence", "maximum"},
		{"moderation", `{"category":"spam","confidence":-0.1,"needsHumanReview":false}`, "output.confidence", "minimum"},
		{"moderation", `{"category":"spam","confidence":0.5,"needsHumanReview":"no"}`, "output.needsHumanReview", "type"},
	}
	for _, tc := range cases {
		t.Run(tc.contract+"/"+tc.field+"/"+tc.keyword, func(t *testing.T) {
			c := mustGet(t, r, tc.contract)
			var plain any
			if err := json.Unmarshal([]byte(tc.doc), &plain); err != nil {
				t.Fatal(err)
			}
			// Both decodings a caller may use must be refused alike.
			for _, doc := range []any{plain, mustDecodeAny(t, tc.doc), []byte(tc.doc)} {
				err := c.ValidateOutput(doc)
				var ve *ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("ValidateOutput(%T) = %v, want a *ValidationError", doc, err)
				}
				if !slices.ContainsFunc(ve.Violations, func(v Violation) bool { return v.Field == tc.field && v.Keyword == tc.keyword }) {
					t.Fatalf("violations %v lack %s: %s", ve.Violations, tc.field, tc.keyword)
				}
				if !strings.Contains(err.Error(), tc.field+": "+tc.keyword+": ") {
					t.Fatalf("Error() = %q does not name %s and %s", err, tc.field, tc.keyword)
				}
			}
		})
	}
}

func TestMissingRequiredIsNotATypeError(t *testing.T) {
	c := mustGet(t, mustLoad(t), "code-review")
	err := c.ValidateOutput(decode(t, `{"schemaVersion":1,"findings":[]}`))
	if got, want := err.Error(), "output: required: Required property 'changeId' is missing"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestValidateOutputAccepts(t *testing.T) {
	r := mustLoad(t)
	for name, doc := range map[string]string{
		"code-review":   validCodeReview,
		"change-review": `{"schema_version":"change-review.v1","severity":"high","tags":["auth","rollback"],"findings":[{"code":"MISSING_AUTH_CHECK","severity":"high","summary":"s"}]}`,
		"moderation":    `{"category":"other","confidence":1,"needsHumanReview":false}`,
	} {
		if err := mustGet(t, r, name).ValidateOutput(decode(t, doc)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestValidateInput(t *testing.T) {
	r := mustLoad(t)
	diffJSON, _ := json.Marshal(sampleDiff)
	cases := []struct {
		contract, input, want string // want "" means valid
	}{
		{"code-review", `{"diff":` + string(diffJSON) + `,"title":"Fix login"}`, ""},
		{"code-review", `{"diff":` + string(diffJSON) + `}`, ""},
		{"change-review", `{"diff":` + string(diffJSON) + `}`, ""},
		{"change-review", `{"diff":"not a diff"}`, ""}, // not grounded: the diff is only context
		{"moderation", `{"text":"hello"}`, ""},
		{"code-review", `{"diff":"not a diff"}`, "input.diff: diff: not a unified diff"},
		{"code-review", `{"diff":""}`, "input.diff: minLength: "},
		{"code-review", `{"diff":"` + strings.Repeat("x", 8<<20+1) + `"}`, "input.diff: maxLength: "},
		{"code-review", `{"diff":` + string(diffJSON) + `,"title":"` + strings.Repeat("t", 301) + `"}`, "input.title: maxLength: "},
		{"code-review", `{"diff":` + string(diffJSON) + `,"repo":"x"}`, "input: additionalProperties: has a property the schema does not allow, named (4 bytes, sha256:"},
		{"code-review", `{"title":"x"}`, "input: required: Required property 'diff' is missing"},
		{"code-review", `{"diff":42}`, "input.diff: type: "},
		{"code-review", `["diff"]`, "input: json: not a JSON object but an array"},
		{"code-review", `{"diff":` + string(diffJSON) + `} {}`, "input: json: invalid JSON: data after the top-level value"},
		{"code-review", `{"diff":`, "input: json: invalid JSON"},
		{"moderation", `{"text":""}`, "input.text: minLength: "},
		{"moderation", `{"text":"` + strings.Repeat("x", 20001) + `"}`, "input.text: maxLength: "},
	}
	for _, tc := range cases {
		err := mustGet(t, r, tc.contract).ValidateInput([]byte(tc.input))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %.60s: %v", tc.contract, tc.input, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %.60s: error %v, want %q", tc.contract, tc.input, err, tc.want)
		}
	}
}

func TestErrorListsAtMostFive(t *testing.T) {
	c := mustGet(t, mustLoad(t), "code-review")
	var fs []string
	for range 7 {
		fs = append(fs, `{"file":"a","line":0,"severity":"info","summary":"s","evidence":"e"}`)
	}
	err := c.ValidateOutput(decode(t, `{"schemaVersion":1,"changeId":"w","findings":[`+strings.Join(fs, ",")+`]}`))
	if !strings.HasSuffix(err.Error(), "; and 2 more") {
		t.Fatalf("Error() = %q", err)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Violations) != 7 || ve.Violations[6].Field != "output.findings[6].line" {
		t.Fatalf("violations = %v", ve.Violations)
	}
}

func TestConcurrentValidation(t *testing.T) {
	c := mustGet(t, mustLoad(t), "code-review")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if err := c.ValidateOutput(mustDecodeAny(t, validCodeReview)); err != nil {
					t.Error(err)
					return
				}
				if c.ValidateOutput(mustDecodeAny(t, `{"findings":[]}`)) == nil {
					t.Error("invalid output accepted")
					return
				}
			}
		})
	}
	wg.Wait()
}

func mustDecodeAny(t testing.TB, s string) any {
	t.Helper()
	v, err := decodeValue([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func findings(n int) string {
	f := make([]string, n)
	for i := range f {
		f[i] = `{"file":"a","line":1,"severity":"info","summary":"s","evidence":"e"}`
	}
	return "[" + strings.Join(f, ",") + "]"
}

// A code review's diff is cut into parts by the manifest's rule, and a
// merge of parts keeps to the schema's cap on findings.
func TestPartsAndFindingsCap(t *testing.T) {
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := r.Get("code-review")
	if c.Parts.Units <= 0 || c.Parts.BytesPerUnit <= 0 || c.MaxFindings != 20 {
		t.Fatalf("code-review parts %+v, max findings %d; want a part size and the schema's 20", c.Parts, c.MaxFindings)
	}
	m, _ := r.Get("moderation")
	if m.Parts.Units != 0 || m.MaxFindings != 0 {
		t.Fatalf("moderation parts %+v, max findings %d; want none", m.Parts, m.MaxFindings)
	}
}
