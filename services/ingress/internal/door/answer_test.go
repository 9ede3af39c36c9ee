package door

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Every 429 gives Retry-After in whole seconds, rounded up, and a
// submission's message names the same number.
func TestRetryLater(t *testing.T) {
	t.Parallel()
	read := func(rec *httptest.ResponseRecorder) (code, message string) {
		t.Helper()
		var e struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatalf("body %s: %v", rec.Body, err)
		}
		return e.Error.Code, e.Error.Message
	}
	rec := httptest.NewRecorder()
	TooMany(rec, "rate_limited", "over the rate", 1200*time.Millisecond)
	code, msg := read(rec)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" || code != "rate_limited" ||
		msg != "over the rate; retry after 2 s (nothing was stored)" {
		t.Errorf("submission: %d, Retry-After %q, %s %q", rec.Code, rec.Header().Get("Retry-After"), code, msg)
	}
	rec = httptest.NewRecorder()
	RetryLater(rec, "too_many_streams", "close one first", StreamsFullWait)
	code, msg = read(rec)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "5" || code != "too_many_streams" ||
		msg != "close one first" {
		t.Errorf("stream: %d, Retry-After %q, %s %q", rec.Code, rec.Header().Get("Retry-After"), code, msg)
	}
}
