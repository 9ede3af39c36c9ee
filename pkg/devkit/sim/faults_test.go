package sim

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// A fault setting is read strictly: a misspelt field, an unknown kind, a
// missing kind or a field the kind does not use is refused with 400 and a
// message naming it, and nothing is set, so no call is bent by a fault
// that was not meant; a batch fault likewise. A well-formed one is set.
func TestFaultSettingsAreReadStrictly(t *testing.T) {
	s, base := start(t)
	for _, c := range []struct{ body, want string }{
		{`{"kind":"rate_limit","tims":2}`, `fault: unknown field "tims" (a fault has kind, tenant, match, times, retryAfter, latency, size)`},
		{`{"kind":"server_error","tenat":"acme","times":1}`, `unknown field "tenat"`},
		{`{"kind":"ratelimit","times":1}`, `fault: unknown kind "ratelimit" (kinds: rate_limit, latency, hang,`},
		{`{"times":1}`, "fault: kind is required, one of rate_limit,"},
		{`{"kind":"server_error","retryAfter":"2s"}`, "retryAfter is for rate_limit and unavailable, not server_error"},
		{`{"kind":"rate_limit","latency":"2s"}`, "latency is for the latency kind, not rate_limit"},
		{`{"kind":"truncated","size":4096}`, "size is a positive byte count for the huge kind"},
		{`{"kind":"latency","latency":"soon"}`, "fault: latency: "},
		{`{"kind":"latency","latency":"1s"} {"kind":"hang"}`, "invalid"},
	} {
		r := mustDo(t, "POST", base+"/sim/faults", c.body)
		if msg := errMessage(r.body); r.status != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("POST /sim/faults %s: %d %q; want 400 saying %q", c.body, r.status, msg, c.want)
		}
	}
	if got := s.Faults(); len(got) != 0 {
		t.Fatalf("faults set by refused requests: %+v", got)
	}
	r := mustDo(t, "POST", base+"/sim/faults", `{"kind":"unavailable","tenant":"acme","match":"x","times":2,"retryAfter":"3s"}`)
	want := Fault{Kind: FaultUnavailable, Tenant: "acme", Match: "x", Times: 2, RetryAfter: 3 * time.Second}
	if got := s.Faults(); r.status != http.StatusCreated || len(got) != 1 || got[0] != want {
		t.Fatalf("POST a good fault: %d %s; faults %+v", r.status, r.body, got)
	}
	var back Fault
	if err := json.Unmarshal(r.body, &back); err != nil || back != want {
		t.Fatalf("the answer %s reads back as %+v (%v)", r.body, back, err)
	}
	r = mustDo(t, "POST", base+"/sim/batch-faults", `{"kind":"fail","time":1}`)
	if msg := errMessage(r.body); r.status != http.StatusBadRequest || msg != `batch fault: unknown field "time" (a batch fault has kind, match, times)` {
		t.Errorf("POST /sim/batch-faults with a misspelt field: %d %q", r.status, msg)
	}
}

// errMessage is the message of an OpenAI error envelope.
func errMessage(body []byte) string {
	var e apiError
	_ = json.Unmarshal(body, &e)
	return e.Error.Message
}

// docs/models.md's simulated-provider section names every fault kind and
// every field a fault takes.
func TestREADMEDocumentsEveryFault(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/models.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	from := strings.Index(doc, "\n## The simulated provider\n")
	if from < 0 {
		t.Fatal("docs/models.md has no section \"The simulated provider\"")
	}
	section := doc[from+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, k := range FaultKinds {
		if !strings.Contains(section, "`"+k+"`") {
			t.Errorf("the simulated provider's section does not document fault kind `%s`", k)
		}
	}
	for f := range strings.SplitSeq(faultFields, ", ") {
		if !strings.Contains(section, "`"+f+"`") {
			t.Errorf("the simulated provider's section does not document fault field `%s`", f)
		}
	}
}
