package gate_test

import (
	"reflect"
	"strings"
	"testing"

	"assay.dev/pkg/gate"
)

// Every spelling JSON allows for one number reads as one canonical
// spelling, whichever field it is in.
func TestNumbersHaveOneSpelling(t *testing.T) {
	t.Parallel()
	for want, spellings := range map[string][]string{
		"2":                    {"2", "2.0", "2e0", "20e-1", "0.2e1", "2.000", "2E+0", "200e-2", "0.0000002e7"},
		"0":                    {"0", "-0", "0.0", "0e10", "-0.0e-3", "0e99999999999999999999"},
		"-15":                  {"-15", "-1.5e1", "-150e-1"},
		"0.5":                  {"0.5", "0.50", "5e-1", "0.05e1", "50E-2"},
		"1":                    {"1", "1.0", "1e0", "0.1e1"},
		"9223372036854775807":  {"9223372036854775807", "9223372036854775807.0", "922337203685477580.7e1"},
		"1e+21":                {"1e21", "1000000000000000000000", "10e20"},
		"9223372036854776000":  {"9223372036854775808", "9.223372036854775808e18"},
		"12345678901234567000": {"12345678901234567000", "1.2345678901234567e19"},
		"1e-7":                 {"1e-7", "0.0000001", "10e-8"},
	} {
		for _, s := range spellings {
			acc, err := gate.Read([]byte(`{"n":` + s + `}`))
			if err != nil {
				t.Errorf("%s: %v", s, err)
				continue
			}
			if got := string(acc.Output); got != `{"n":`+want+`}` {
				t.Errorf("%s reads as %s, want %s", s, got, want)
			}
			again, err := gate.Read(acc.Output)
			if err != nil || !reflect.DeepEqual(again, acc) {
				t.Errorf("%s: its canonical form %s reads otherwise: %v", s, acc.Output, err)
			}
		}
	}
}

// An answer with a line written 2.0 is accepted as line 2, in its typed
// findings and its canonical JSON alike; its escapes are resolved.
func TestCheckNormalisesTheAnswer(t *testing.T) {
	t.Parallel()
	out := `{"findings":[{"evidence":"db.Exec(\"UPDATE users SET last_login = now() WHERE name = '\" + u + \"'\")","file":"auth\/login.go",` +
		`"line":1.50e1,"severity":"\u0062locking","summary":"Builds SQL from user input."}],"changeId":"wrk_01","schemaVersion":1.0}`
	acc, f := gate.Check(get(t, "code-review"), []byte(out), expect("code-review"))
	if f != nil {
		t.Fatal(f)
	}
	want := gate.Finding{File: "auth/login.go", Line: 15, Severity: "blocking", Summary: "Builds SQL from user input.",
		Evidence: sqlFinding["evidence"].(string)}
	if len(acc.Findings) != 1 || acc.Findings[0] != want {
		t.Fatalf("Findings = %+v, want %+v", acc.Findings, want)
	}
	if got := string(acc.Output); got != codeReview(sqlFinding) {
		t.Fatalf("Output = %s, want %s", got, codeReview(sqlFinding))
	}
}

// Two findings that differ only in how a number is spelled are one
// finding: the duplicate check reads the normalised answer.
func TestDuplicateAcrossSpellings(t *testing.T) {
	t.Parallel()
	for _, spelling := range []string{"15.0", "1.5e1", "150e-1", "0.15e2"} {
		twice := codeReview(sqlFinding, logFinding, sqlFinding)
		twice = strings.Replace(twice, `"line":15`, `"line":`+spelling, 1)
		_, f := gate.Check(get(t, "code-review"), []byte(twice), expect("code-review"))
		if f == nil || f.Code != gate.CodeDuplicateFinding || !strings.Contains(f.Detail, "findings[2] repeats findings[0]") {
			t.Errorf("line %s beside line 15: %v; want policy.duplicate_finding", spelling, f)
		}
	}
	// A number field reads alike however it is spelled.
	conf := `{"category":"spam","confidence":5e-1,"needsHumanReview":false}`
	acc, f := gate.Check(get(t, "moderation"), []byte(conf), expect("moderation"))
	if f != nil || string(acc.Output) != `{"category":"spam","confidence":0.5,"needsHumanReview":false}` {
		t.Fatalf("moderation with confidence 5e-1: %v %s", f, acc.Output)
	}
}

// A number beyond the range of a double is refused: no reader could read
// it as the gate did.
func TestNumberBeyondADouble(t *testing.T) {
	t.Parallel()
	_, f := gate.Check(get(t, "code-review"), []byte(strings.Replace(codeReview(sqlFinding), `"line":15`, `"line":1e400`, 1)), expect("code-review"))
	if f == nil || f.Code != gate.CodeInvalidJSON || f.Detail != "output.findings[0].line is a number beyond the range of a double" {
		t.Fatalf("got %v", f)
	}
}

// Read refuses what no accepted answer can be, so that no reader takes an
// unreadable result for one without findings.
func TestReadRefuses(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ output, err string }{
		"not JSON":            {`{"findings":[`, "invalid JSON"},
		"not an object":       {`[]`, "not a JSON object"},
		"trailing data":       {`{} {}`, "data after the top-level value"},
		"findings not a list": {`{"findings":{}}`, "findings is an object, not an array"},
		"finding not object":  {`{"findings":[1]}`, "findings[0] is a number, not an object"},
		"line a string":       {`{"findings":[{"file":"a.go","line":"2"}]}`, "findings[0].line is not a line number"},
		"line a fraction":     {`{"findings":[{"file":"a.go","line":2.5}]}`, "findings[0].line is not a line number"},
		"line zero":           {`{"findings":[{"file":"a.go","line":0}]}`, "findings[0].line is not a line number"},
		"file a number":       {`{"findings":[{"file":7,"line":2}]}`, "findings[0].file is a number, not a string"},
		"confidence a string": {`{"findings":[{"confidence":"high"}]}`, "findings[0].confidence is a string, not a number"},
		"number out of range": {`{"findings":[{"line":1e999}]}`, "output.findings[0].line is a number beyond the range of a double"},
	} {
		if _, err := gate.Read([]byte(c.output)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: Read = %v, want an error with %q", name, err, c.err)
		}
	}
}
