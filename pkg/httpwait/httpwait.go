// Package httpwait reads the wait an HTTP server asks of its client before
// the next request: Retry-After (RFC 9110), and retry-after-ms as model
// providers send it. The model client and the GitHub and callback
// publishers read it here, alike.
package httpwait

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Max caps a server's wait rather than overflow a Duration.
const Max = 24 * time.Hour

// RetryAfter reads a Retry-After value: delay-seconds, or an HTTP-date
// taken relative to now. ok is false when v is absent or unreadable (a
// negative delay too); a date past is a wait of 0. Waits over Max are Max.
func RetryAfter(v string, now time.Time) (wait time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, int64(Max/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), Max), true
	}
	return 0, false
}

// RetryAfterMS reads a retry-after-ms value: milliseconds, possibly
// fractional. Absent, unreadable or non-positive values are 0.
func RetryAfterMS(v string) time.Duration {
	ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(ms) || math.IsInf(ms, 0) || ms <= 0 {
		return 0
	}
	if ms >= float64(Max/time.Millisecond) {
		return Max
	}
	return time.Duration(math.Ceil(ms * float64(time.Millisecond)))
}
