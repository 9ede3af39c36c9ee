package httpwait

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                               0,
		"0":                              0,
		"-3":                             0,
		" 12 ":                           12 * time.Second,
		"soon":                           0,
		"Sun, 01 Mar 2026 12:00:30 GMT":  30 * time.Second,
		"Sunday, 01-Mar-26 12:01:00 GMT": time.Minute,
		"Sun, 01 Mar 2026 11:59:00 GMT":  0,
		"99999999999":                    24 * time.Hour,
	}
	for in, want := range cases {
		got, ok := RetryAfter(in, now)
		if got != want {
			t.Errorf("RetryAfter(%q) = %v, want %v", in, got, want)
		}
		if readable := !slices.Contains([]string{"", "-3", "soon"}, in); ok != readable {
			t.Errorf("RetryAfter(%q) ok = %v, want %v", in, ok, readable)
		}
	}
}

func TestRetryAfterMS(t *testing.T) {
	t.Parallel()
	cases := map[string]time.Duration{
		"":            0,
		"0":           0,
		"-5":          0,
		"soon":        0,
		"NaN":         0,
		"Inf":         0,
		"1":           time.Millisecond,
		" 334 ":       334 * time.Millisecond,
		"1500.25":     1500250 * time.Microsecond,
		"0.0000001":   time.Nanosecond, // rounded up, never 0
		"99999999999": 24 * time.Hour,
	}
	for in, want := range cases {
		if got := RetryAfterMS(in); got != want {
			t.Errorf("RetryAfterMS(%q) = %v, want %v", in, got, want)
		}
	}
}

func ExampleRetryAfter() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fmt.Println(RetryAfter("3", now))
	fmt.Println(RetryAfter("Sun, 01 Mar 2026 12:01:30 GMT", now))
	fmt.Println(RetryAfter("", now))
	// Output:
	// 3s true
	// 1m30s true
	// 0s false
}
