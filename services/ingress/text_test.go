package ingress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"assay.dev/pkg/store"
)

// A string whose JSON escapes spell a NUL or a surrogate half alone is
// refused with where it is, as a value or a key, in a field or in a free
// input; escapes that spell text (a pair, U+FFFD itself, an escaped
// backslash before "ud800") pass, read whole or a byte at a time.
func TestDecodeStrictRefusesEscapesThatAreNotText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, path string
		key, nul   bool
	}{
		{`{"contract":"a\u0000b"}`, "contract", false, true},
		{`{"contract":"\ud800"}`, "contract", false, false},
		{`{"contract":"x\uDBFFy"}`, "contract", false, false},
		{`{"contract":"\udc00\ud800"}`, "contract", false, false},
		{`{"contract":"\ud800\u0041"}`, "contract", false, false},
		{`{"contract":"\ud800` + "\uFFFD" + `"}`, "contract", false, false},
		{`{"input":{"text":"\udfff"}}`, "input.text", false, false},
		{`{"input":{"a":["ok","\u0000"]}}`, "input.a[1]", false, true},
		{`{"input":{"k\u0000":1}}`, "input", true, true},
		{`{"input":{"\ud800":1}}`, "input", true, false},
		{`{"sou\u0000rceId":"x"}`, "", true, true},
	} {
		for name, read := range map[string]func() error{
			"whole": func() error { var r SubmitRequest; return decodeStrict([]byte(c.body), &r) },
			"bytewise": func() error {
				var r SubmitRequest
				return decodeStrictFrom(iotest.OneByteReader(strings.NewReader(c.body)), &r)
			},
		} {
			var ee *EscapeError
			if err := read(); !errors.As(err, &ee) || ee.Path != c.path || ee.Key != c.key || ee.NUL != c.nul {
				t.Errorf("%s read %s: %v, want an escape error at %q (key %v, NUL %v)", c.body, name, err, c.path, c.key, c.nul)
			}
		}
	}
	for _, body := range []string{
		`{"contract":"\ud83d\ude00 \uD83D\uDE00"}`,
		`{"contract":"\ufffd and ` + "\uFFFD" + `"}`,
		`{"contract":"\\ud800"}`,
		`{"contract":"\\\ud83d\ude00\"\\"}`,
		`{"input":{"note":"a \"quoted\" \ufffd"}}`,
	} {
		var r SubmitRequest
		if err := decodeStrict([]byte(body), &r); err != nil {
			t.Errorf("%s: %v, want it read", body, err)
		}
	}
}

// loneSurrogate reads a literal's escapes in order: an escaped backslash
// starts no escape, and a high half is paired only by a low half right
// after it.
func TestLoneSurrogate(t *testing.T) {
	t.Parallel()
	for lit, want := range map[string]bool{
		``: false, `plain`: false, `\ud83d\ude00`: false, `\\ud800`: false, `\\\ud83d\ude00`: false,
		`\ud800`: true, `\\\ud800`: true, `\udc00`: true, `\ud83d`: true, `\ud83dx\ude00`: true,
		`\ud83d\u0041`: true, `\ud83d\ud83d\ude00`: true, `\ud83d\ude00\ude00`: true, `\u00e9\ud800`: true,
	} {
		if got := loneSurrogate([]byte(lit)); got != want {
			t.Errorf("loneSurrogate(%s) = %v, want %v", lit, got, want)
		}
	}
	for b, want := range map[string]string{`"x"`: `x`, `"a\"b"`: `a\"b`, `{"k":"a\\"`: `a\\`, `"\\\""`: `\\\"`, `x`: ``} {
		if got := string(rawString([]byte(b))); got != want {
			t.Errorf("rawString(%s) = %s, want %s", b, got, want)
		}
	}
}

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
