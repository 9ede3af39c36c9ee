package ingress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"assay.dev/pkg/store"
)

// request sends a request to the env's ingress with token, the body raw.
func (e *webhookEnv) request(method, path, token, body string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, body: buf.Bytes()}
}

// noErrorLogged fails if the ingress logged an ERROR line: a refusal of
// the caller's bytes is no fault of the cell's.
func (e *webhookEnv) noErrorLogged() {
	e.t.Helper()
	e.log.mu.Lock()
	defer e.log.mu.Unlock()
	for _, line := range bytes.Split(e.log.b.Bytes(), []byte("\n")) {
		if bytes.Contains(line, []byte(`"level":"ERROR"`)) {
			e.t.Errorf("logged %s", line)
		}
	}
}

// The sweep's reproductions, each on the route it was found on: bytes that
// are not text in a path, a crafted cursor, a tenant filter, and a note
// whose escapes spell a NUL or a surrogate half were answered 503 (or
// rewritten to U+FFFD and taken); each is now refused with the status and
// code that say what is wrong, nothing reaches the database, and nothing
// is logged as the cell's error.
func TestBadBytesAreRefusedAtTheEdge(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	if err := e.st.AddOperatorTokenAs(t.Context(), "ops", store.RoleOperator, "tok-ops"); err != nil {
		t.Fatal(err)
	}
	a := e.postRaw([]byte(`{"contract":"moderation","sourceId":"post-1","revision":"r1","input":{"text":"hello"}}`))
	var sub SubmitResponse
	if err := json.Unmarshal(a.body, &sub); a.status != http.StatusAccepted || err != nil {
		t.Fatalf("submit: %d %s", a.status, a.body)
	}
	cursor := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
	reviewCursor := func(id string) string { return cursor("2026-01-02T03:04:05Z|" + id) }
	type check struct {
		name, method, path, token, body string
		status                          int
		code, says                      string
	}
	var checks []check
	for _, bad := range []string{"%00", "%ff", "%c0%80", "%ed%a0%80", "w_%00"} {
		checks = append(checks,
			check{"work", "GET", "/v1/work/" + bad, "tok-acme", "", 404, "not_found", ""},
			check{"work events", "GET", "/v1/work/" + bad + "/events", "tok-acme", "", 404, "not_found", ""},
			check{"work story", "GET", "/v1/console/work/" + bad, "tok-ops", "", 404, "not_found", ""},
			check{"work action", "POST", "/v1/console/work/" + bad + "/actions", "tok-ops", `{"action":"cancel","confirm":"x"}`, 404, "not_found", ""},
			check{"tenant filter of work", "GET", "/v1/console/work?tenant=" + bad, "tok-ops", "", 400, "invalid_query", `tenant`},
			check{"tenant filter of reviews", "GET", "/v1/console/reviews?tenant=" + bad, "tok-ops", "", 400, "invalid_query", `tenant`},
			check{"state filter", "GET", "/v1/work?state=" + bad, "tok-acme", "", 400, "invalid_query", `state`},
			check{"a parameter no listing takes", "GET", "/v1/reviews?x" + bad + "=1", "tok-acme", "", 400, "invalid_query", "name"},
		)
	}
	for _, raw := range []string{"1767225600000000 w_\x00", "1767225600000000 \xff", "-9223372036854775808 w_x", "9223372036854775807 w_x"} {
		checks = append(checks,
			check{"work cursor", "GET", "/v1/work?cursor=" + cursor(raw), "tok-acme", "", 400, "invalid_query", "cursor"},
			check{"console work cursor", "GET", "/v1/console/work?cursor=" + cursor(raw), "tok-ops", "", 400, "invalid_query", "cursor"},
		)
	}
	for _, id := range []string{"w_\x00", "\xff", "\xed\xa0\x80"} {
		checks = append(checks,
			check{"review cursor", "GET", "/v1/reviews?cursor=" + reviewCursor(id), "tok-acme", "", 400, "invalid_query", "cursor"},
			check{"console review cursor", "GET", "/v1/console/reviews?cursor=" + reviewCursor(id), "tok-ops", "", 400, "invalid_query", "cursor"},
		)
	}
	act := "/v1/console/work/" + sub.WorkID + "/actions"
	for _, note := range []string{`\u0000`, `a\u0000b`, `\ud800`, `x\udfff`, `\udc00\ud800`} {
		checks = append(checks,
			check{"action note", "POST", act, "tok-ops", `{"action":"cancel","confirm":"` + sub.WorkID + `","note":"` + note + `"}`, 400, "invalid_input", "note"},
			check{"review note", "POST", "/v1/reviews/rv_000000000000000000000000/resolve", "tok-acme",
				`{"by":"reviewer@example.com","verdict":"approved","note":"` + note + `"}`, 400, "invalid_input", "note"},
			check{"resolver", "POST", "/v1/reviews/rv_000000000000000000000000/resolve", "tok-acme",
				`{"by":"reviewer` + note + `","verdict":"approved"}`, 400, "invalid_input", "by"},
			check{"desk note", "POST", "/v1/console/reviews/rv_000000000000000000000000/resolve", "tok-ops",
				`{"verdict":"dismissed","note":"` + note + `"}`, 400, "invalid_input", "note"},
			check{"amendment", "POST", "/v1/console/reviews/rv_000000000000000000000000/resolve", "tok-ops",
				`{"verdict":"amended","findings":[{"title":"` + note + `"}]}`, 400, "invalid_input", "findings[0].title"},
		)
	}
	for _, c := range checks {
		a := e.request(c.method, c.path, c.token, c.body)
		var doc struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(a.body, &doc)
		if a.status != c.status || doc.Error.Code != c.code || !strings.Contains(doc.Error.Message, c.says) {
			t.Errorf("%s: %s %q %s: %d %s, want %d %s naming %q", c.name, c.method, c.path, c.body, a.status, a.body, c.status, c.code, c.says)
		}
	}
	// The work acted on is as it was: every refused action left it queued.
	if n := e.count(`SELECT count(*) FROM work WHERE id = $1 AND state = 'queued'`, sub.WorkID); n != 1 {
		t.Fatalf("the work is no longer queued after refused actions")
	}
	// Escapes that spell text are taken as they were sent: a pair, and
	// U+FFFD itself.
	if a := e.request("POST", act, "tok-ops", `{"action":"cancel","confirm":"`+sub.WorkID+`","note":"\ud83d\ude00 \ufffd"}`); a.status != http.StatusOK {
		t.Fatalf("cancel with a note of text: %d %s", a.status, a.body)
	}
	if n := e.count(`SELECT count(*) FROM work_actions WHERE work_id = $1 AND note = $2`, sub.WorkID, "\U0001F600 \uFFFD"); n != 1 {
		t.Errorf("the note of text is not stored as it was sent")
	}
	e.noErrorLogged()
}
