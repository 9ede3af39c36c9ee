package ingress

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// badBytes are byte strings Postgres cannot store as text: bytes that are
// not UTF-8, an overlong encoding, a surrogate, a NUL.
var badBytes = map[string]string{
	"not utf-8":      "\xff\xfe",
	"overlong slash": "\xc0\xaf",
	"surrogate":      "\xed\xa0\x80",
	"cut rune":       "\xe2\x82",
	"nul":            "\x00",
}

func (e *webhookEnv) postRaw(body []byte) answer {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/work", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return answer{status: resp.StatusCode, body: buf.Bytes()}
}

// Bad bytes in any text field of a submission get 400 invalid_input with
// the offending position, never a 5xx or "try again", and nothing is
// stored.
func TestSubmitRefusesBytesThatAreNotText(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	fields := map[string]string{
		"contract": `{"contract":"moderation@","sourceId":"post-1","revision":"r1","input":{"text":"hello"}}`,
		"sourceId": `{"contract":"moderation","sourceId":"post-1@","revision":"r1","input":{"text":"hello"}}`,
		"revision": `{"contract":"moderation","sourceId":"post-1","revision":"r1@","input":{"text":"hello"}}`,
		"lane":     `{"contract":"moderation","sourceId":"post-1","revision":"r1","lane":"batch@","input":{"text":"hello"}}`,
		"input":    `{"contract":"moderation","sourceId":"post-1","revision":"r1","input":{"text":"hello @ world"}}`,
		"key":      `{"contract":"moderation","sourceId":"post-1","revision":"r1","input":{"text@":"hello"}}`,
	}
	for field, tmpl := range fields {
		for name, bad := range badBytes {
			body := []byte(strings.Replace(tmpl, "@", bad, 1))
			a := e.postRaw(body)
			at := strings.Index(string(body), bad)
			if a.status != http.StatusBadRequest || a.code() != "invalid_input" || !strings.Contains(string(a.body), "at byte "+itoa(at)) {
				t.Errorf("%s with %s: %d %s, want 400 invalid_input at byte %d", field, name, a.status, a.body, at)
			}
		}
	}
	e.nothingStored()
}

// Bad bytes in a webhook's payload, or in the diff GitHub sends for it,
// get 400 invalid_payload with the position, and nothing is stored.
func TestWebhookRefusesBytesThatAreNotText(t *testing.T) {
	t.Parallel()
	e := newWebhookEnv(t, nil)
	payload := string(readPayload(t, "pull_request_opened.json"))
	for name, bad := range badBytes {
		body := []byte(strings.Replace(payload, `"title": "`, `"title": "`+bad, 1))
		if !bytes.Contains(body, []byte(bad)) {
			t.Fatal("the payload has no title to spoil")
		}
		if a := e.deliver("pull_request", "d-bytes-"+strings.ReplaceAll(name, " ", "-"), body); a.status != http.StatusBadRequest ||
			a.code() != "invalid_payload" || !strings.Contains(string(a.body), "at byte") {
			t.Errorf("payload with %s: %d %s, want 400 invalid_payload", name, a.status, a.body)
		}
	}
	for name, bad := range badBytes {
		e.gh.setDiff(prSource, "diff --git a/x.go b/x.go\n--- a/x.go\n+++ b/x.go\n@@ -1 +1 @@\n-a\n+b"+bad+"\n")
		if a := e.deliver("pull_request", "d-diff-"+strings.ReplaceAll(name, " ", "-"), readPayload(t, "pull_request_opened.json")); a.status != http.StatusBadRequest ||
			a.code() != "invalid_payload" || !strings.Contains(string(a.body), "diff has") {
			t.Errorf("diff with %s: %d %s, want 400 invalid_payload", name, a.status, a.body)
		}
	}
	e.nothingStored()
}

func itoa(n int) string { return strconv.Itoa(n) }
