package admission_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"assay.dev/pkg/admission"
)

type take struct {
	after     time.Duration // advance the clock first
	key       string
	perMinute float64
	burst     int
	ok        bool
	retry     time.Duration
}

func runTakes(t *testing.T, takes []take) {
	t.Helper()
	clk := newClock()
	b := admission.NewBuckets(clk.Now)
	for i, tk := range takes {
		clk.Advance(tk.after)
		ok, retry := b.Take(tk.key, tk.perMinute, tk.burst)
		if ok != tk.ok || retry != tk.retry {
			t.Fatalf("take %d (%+v): got (%v, %v), want (%v, %v)", i, tk, ok, retry, tk.ok, tk.retry)
		}
	}
}

func TestBucketsRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	runTakes(t, []take{
		{0, "a", 60, 2, true, 0},
		{0, "a", 60, 2, true, 0},
		{0, "a", 60, 2, false, time.Second},
		{250 * time.Millisecond, "a", 60, 2, false, 750 * time.Millisecond},
		{749 * time.Millisecond, "a", 60, 2, false, time.Millisecond},
		{time.Millisecond, "a", 60, 2, true, 0},
		{0, "a", 60, 2, false, time.Second},
		// 7 a minute: one token every 8.571428571s, rounded up.
		{0, "b", 7, 1, true, 0},
		{0, "b", 7, 1, false, 8572 * time.Millisecond},
		{8571 * time.Millisecond, "b", 7, 1, false, time.Millisecond},
		{time.Millisecond, "b", 7, 1, true, 0},
		// A fraction of a millisecond still waits one.
		{0, "c", 60000, 1, true, 0},
		{0, "c", 60000, 1, false, time.Millisecond},
		{999 * time.Microsecond, "c", 60000, 1, false, time.Millisecond},
	})
}

func TestBucketsRefillUpToBurst(t *testing.T) {
	t.Parallel()
	takes := []take{{0, "a", 60, 3, true, 0}, {0, "a", 60, 3, true, 0}, {0, "a", 60, 3, true, 0}, {0, "a", 60, 3, false, time.Second}}
	// An hour idle refills to the burst, not beyond.
	takes = append(takes, take{time.Hour, "a", 60, 3, true, 0}, take{0, "a", 60, 3, true, 0}, take{0, "a", 60, 3, true, 0}, take{0, "a", 60, 3, false, time.Second})
	// Refill is continuous: 1.5s gives one token and half of the next.
	takes = append(takes, take{1500 * time.Millisecond, "a", 60, 3, true, 0}, take{0, "a", 60, 3, false, 500 * time.Millisecond})
	// Keys are apart; burst below 1 counts as 1; no rate means no limit.
	takes = append(takes, take{0, "b", 60, 0, true, 0}, take{0, "b", 60, 0, false, time.Second})
	for range 100 {
		takes = append(takes, take{0, "c", 0, 0, true, 0})
	}
	runTakes(t, takes)
}

func TestBucketsChangeOfRateKeepsTokens(t *testing.T) {
	t.Parallel()
	runTakes(t, []take{
		{0, "a", 60, 5, true, 0},
		{0, "a", 60, 5, true, 0}, // 3 left
		// A bigger burst keeps 3, it does not refill to 10.
		{0, "a", 60, 10, true, 0},
		{0, "a", 60, 10, true, 0},
		{0, "a", 60, 10, true, 0},
		{0, "a", 60, 10, false, time.Second},
		// 4s later 4 tokens; a smaller burst caps them at 2.
		{4 * time.Second, "a", 60, 2, true, 0},
		{0, "a", 60, 2, true, 0},
		{0, "a", 60, 2, false, time.Second},
		// Half a token at 60/min is still half a token at 6/min: 5s more.
		{500 * time.Millisecond, "a", 6, 2, false, 5 * time.Second},
		{5 * time.Second, "a", 6, 2, true, 0},
	})
}

func TestBucketsForgetFullBuckets(t *testing.T) {
	t.Parallel()
	clk := newClock()
	b := admission.NewBuckets(clk.Now)
	for i := range 3000 {
		if ok, _ := b.Take("tenant-"+strconv.Itoa(i), 60, 2); !ok {
			t.Fatalf("first take of tenant-%d refused", i)
		}
	}
	if n := b.Len(); n != 3000 {
		t.Fatalf("Len() = %d after 3000 keys, want 3000 (none full yet)", n)
	}
	// The busy tenant drains its bucket; everyone else refills.
	clk.Advance(time.Second)
	for range 3001 {
		b.Take("busy", 60, 2)
	}
	if n := b.Len(); n != 1 {
		t.Fatalf("Len() = %d after a sweep, want 1 (the busy, empty bucket)", n)
	}
	if ok, retry := b.Take("busy", 60, 2); ok || retry != time.Second {
		t.Fatalf("busy bucket forgotten: (%v, %v)", ok, retry)
	}
	if ok, _ := b.Take("tenant-7", 60, 2); !ok {
		t.Fatal("a forgotten bucket must come back full")
	}
}

func ExampleBuckets() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := admission.NewBuckets(func() time.Time { return now })
	for range 3 {
		fmt.Println(b.Take("acme/interactive", 60, 2))
	}
	now = now.Add(250 * time.Millisecond)
	fmt.Println(b.Take("acme/interactive", 60, 2))
	// Output:
	// true 0s
	// true 0s
	// false 1s
	// false 750ms
}
