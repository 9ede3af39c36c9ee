package publish

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
)

// A budget lets writes through up to each limit, and then says how long
// until the oldest write in the full window leaves it (the window kept 2s
// longer than GitHub's); a hold GitHub imposed stops writes until it
// ends.
func TestBudgetSpreadsWritesUnderBothLimits(t *testing.T) {
	c := &clock{t: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	add := func(d time.Duration) { c.Set(c.Now().Add(d)) }
	b := &Budget{PerMinute: 3, PerHour: 5, Now: c.Now}
	ctx := t.Context()
	take := func(inst int64) time.Duration {
		t.Helper()
		wait, err := b.Take(ctx, inst)
		if err != nil {
			t.Fatal(err)
		}
		return wait
	}
	for i := range 3 {
		if w := take(1); w != 0 {
			t.Fatalf("write %d of 3 a minute waits %s", i+1, w)
		}
		add(10 * time.Second)
	}
	// Writes at 0s, 10s and 20s; now 30s: the first leaves the minute at
	// 62s.
	if w := take(1); w != 32*time.Second {
		t.Fatalf("the fourth write in a minute waits %s, want 32s", w)
	}
	if w := take(2); w != 0 {
		t.Fatalf("another installation's write waits %s", w)
	}
	add(32 * time.Second)
	// At 62s the write at 0s has left the minute: one more fits, and the
	// next waits for the one at 10s to leave.
	if w := take(1); w != 0 {
		t.Fatalf("the fourth write, at 62s, waits %s", w)
	}
	if w := take(1); w != 10*time.Second {
		t.Fatalf("the fifth write at 62s waits %s, want 10s", w)
	}
	add(10 * time.Second)
	if w := take(1); w != 0 {
		t.Fatalf("the fifth write, at 72s, waits %s", w)
	}
	// Five writes within the hour, the first at 0s: the sixth waits until
	// that one leaves the hour, whatever the minute says.
	add(5 * time.Minute)
	if want := time.Hour + 2*time.Second - 72*time.Second - 5*time.Minute; take(1) != want {
		t.Fatalf("the sixth write in an hour does not wait %s", want)
	}
	add(time.Hour)
	if w := take(1); w != 0 {
		t.Fatalf("a write an hour later waits %s", w)
	}
	if err := b.Hold(ctx, 1, c.Now().Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := take(1); w != 90*time.Second {
		t.Fatalf("a write while held waits %s, want 90s", w)
	}
	// A shorter hold does not shorten the one in place.
	if err := b.Hold(ctx, 1, c.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if w := take(1); w != 90*time.Second {
		t.Fatalf("after a shorter hold, a write waits %s, want 90s", w)
	}
}

// Publishers that open the same bucket draw from one budget: of many
// writes tried at once by four budgets, exactly the minute's limit goes
// through, and a hold one of them records holds the others.
func TestBudgetIsSharedThroughItsBucket(t *testing.T) {
	js := testenv.JetStream(t)
	open := func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "assay_github_test", History: 1})
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var budgets []*Budget
	for range 4 {
		budgets = append(budgets, &Budget{PerMinute: 7, PerHour: 100, Open: open})
	}
	var through, waited atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		b := budgets[i%len(budgets)]
		wg.Go(func() {
			wait, err := b.Take(ctx, 99)
			switch {
			case err != nil:
				t.Errorf("take: %v", err)
			case wait == 0:
				through.Add(1)
			default:
				waited.Add(1)
			}
		})
	}
	wg.Wait()
	if through.Load() != 7 || waited.Load() != 13 {
		t.Fatalf("of 20 writes tried at once under 7 a minute, %d went through and %d waited", through.Load(), waited.Load())
	}
	for _, b := range budgets {
		if b.kv == nil {
			t.Fatal("a budget kept to its own process: the bucket did not open")
		}
	}
	if err := budgets[0].Hold(ctx, 5, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if w, err := budgets[3].Take(ctx, 5); err != nil || w < 59*time.Minute {
		t.Fatalf("another publisher's write for a held installation waits %s (%v), want about an hour", w, err)
	}
}
