package admission_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"assay.dev/pkg/admission"
)

// clock is a manual clock for scripted tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// changes records OnChange calls as "old→new reason".
type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) record(old, new int, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, fmt.Sprintf("%d→%d %s", old, new, reason))
}

func (c *changes) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

func newLimiter(t testing.TB, cfg admission.LimiterConfig) *admission.Limiter {
	t.Helper()
	l, err := admission.NewLimiter(cfg)
	if err != nil {
		t.Fatalf("NewLimiter: %v", err)
	}
	return l
}

func acquire(t testing.TB, l *admission.Limiter, lane string) *admission.Permit {
	t.Helper()
	p, err := l.Acquire(context.Background(), lane)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", lane, err)
	}
	return p
}

// call makes one call that takes latency on clk and ends with kind, with
// the rest of the limit in use, as under a load that keeps it full.
func call(t testing.TB, l *admission.Limiter, clk *clock, kind admission.SignalKind, latency time.Duration) {
	t.Helper()
	var others []*admission.Permit
	for range l.Limit() - 1 {
		others = append(others, acquire(t, l, admission.Interactive))
	}
	p := acquire(t, l, admission.Interactive)
	clk.Advance(latency)
	p.Release(admission.Signal{Kind: kind, Latency: latency})
	for _, o := range others {
		o.Release(admission.Signal{Kind: admission.Ignore})
	}
}

// With SlowStart every busy clean success grows the limit by one, so it
// doubles each window (4 → 8 after four successes, not after sixteen),
// until the first congestion signal; from then on it grows by one after
// GrowthWindows windows. A 429 and a latency rise both end slow start.
func TestLimiterSlowStartDoublesPerWindow(t *testing.T) {
	t.Parallel()
	const fast, slow = 100 * time.Millisecond, time.Second
	for _, tc := range []struct {
		reason  string
		congest func(testing.TB, *admission.Limiter, *clock)
	}{
		{admission.ReasonRateLimited, func(t testing.TB, l *admission.Limiter, clk *clock) {
			call(t, l, clk, admission.RateLimited, 0)
		}},
		{admission.ReasonLatency, func(t testing.TB, l *admission.Limiter, clk *clock) {
			call(t, l, clk, admission.Success, slow) // ten times the baseline
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			const after = 14
			clk, rec := newClock(), &changes{}
			l := newLimiter(t, admission.LimiterConfig{Initial: 4, Max: 32, SlowStart: true, Now: clk.Now, OnChange: rec.record})
			for i := 1; i <= 12; i++ {
				call(t, l, clk, admission.Success, fast)
				if got := l.Limit(); got != 4+i {
					t.Fatalf("slow start: after %d busy successes from 4, limit %d, want %d", i, got, 4+i)
				}
			}
			tc.congest(t, l, clk) // 16 -> 14
			if got := l.Limit(); got != after {
				t.Fatalf("after the congestion signal: limit %d, want %d", got, after)
			}
			for i := 1; i < 10*after; i++ {
				call(t, l, clk, admission.Success, fast)
				if got := l.Limit(); got != after {
					t.Fatalf("after the congestion, %d successes at %d: limit %d", i, after, got)
				}
			}
			call(t, l, clk, admission.Success, fast)
			if got := l.Limit(); got != after+1 {
				t.Fatalf("after ten windows at %d: limit %d, want %d", after, got, after+1)
			}
			var want []string
			for n := 4; n < 16; n++ {
				want = append(want, fmt.Sprintf("%d→%d growth", n, n+1))
			}
			want = append(want, fmt.Sprintf("16→%d %s", after, tc.reason), fmt.Sprintf("%d→%d growth", after, after+1))
			equal(t, "changes", rec.list(), want)
		})
	}

	// Light traffic in slow start: lone calls are not busy and do not grow it.
	clk := newClock()
	l := newLimiter(t, admission.LimiterConfig{Initial: 4, Max: 32, SlowStart: true, Now: clk.Now})
	for range 1000 {
		p := acquire(t, l, admission.Interactive)
		clk.Advance(fast)
		p.Release(admission.Signal{Kind: admission.Success, Latency: fast})
	}
	if s := l.Stats(); s.Limit != 4 || s.Increases != 0 {
		t.Fatalf("slow start, after 1000 lone calls: %+v, want limit 4 and no growth", s)
	}
}

// Light traffic, one call at a time under a limit of 4, says nothing about
// the provider's room: the limit does not grow.
func TestLimiterDoesNotGrowWhenUnused(t *testing.T) {
	t.Parallel()
	clk := newClock()
	l := newLimiter(t, admission.LimiterConfig{Initial: 4, Max: 32, Now: clk.Now})
	for range 1000 {
		p := acquire(t, l, admission.Interactive)
		clk.Advance(100 * time.Millisecond)
		p.Release(admission.Signal{Kind: admission.Success, Latency: 100 * time.Millisecond})
	}
	if s := l.Stats(); s.Limit != 4 || s.Increases != 0 {
		t.Fatalf("after 1000 lone calls: %+v, want limit 4 and no growth", s)
	}
}

func equal(t testing.TB, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

func TestLimiterGrowsByOnePerWindowUpToMax(t *testing.T) {
	t.Parallel()
	clk, rec := newClock(), &changes{}
	var l *admission.Limiter
	l = newLimiter(t, admission.LimiterConfig{
		Initial: 2, Max: 5, Now: clk.Now,
		OnChange: func(old, new int, reason string) {
			if got := l.Limit(); got != new { // also proves the lock is not held
				t.Errorf("OnChange(%d, %d): Limit() = %d", old, new, got)
			}
			rec.record(old, new, reason)
		},
	})
	for limit := 2; limit < 5; limit++ {
		for i := 1; i < 10*limit; i++ {
			call(t, l, clk, admission.Success, 100*time.Millisecond)
			if got := l.Limit(); got != limit {
				t.Fatalf("after %d successes at limit %d: Limit() = %d", i, limit, got)
			}
		}
		call(t, l, clk, admission.Success, 100*time.Millisecond)
		if got := l.Limit(); got != limit+1 {
			t.Fatalf("after %d successes at limit %d: Limit() = %d, want %d", 10*limit, limit, got, limit+1)
		}
	}
	for range 5000 {
		call(t, l, clk, admission.Success, 100*time.Millisecond)
		if got := l.Limit(); got > 5 {
			t.Fatalf("Limit() = %d above Max 5", got)
		}
	}
	s := l.Stats()
	if s.Limit != 5 || s.Target != 5 || s.Increases != 3 || s.Decreases != 0 {
		t.Fatalf("stats = %+v, want limit 5, 3 increases, no decrease", s)
	}
	if s.Baseline != 100*time.Millisecond || s.Short != 100*time.Millisecond {
		t.Fatalf("constant latency: baseline %v short %v, want exactly 100ms", s.Baseline, s.Short)
	}
	equal(t, "changes", rec.list(), []string{"2→3 growth", "3→4 growth", "4→5 growth"})
}

func TestLimiterDecreasesOncePerEpoch(t *testing.T) {
	t.Parallel()
	rec := &changes{}
	l := newLimiter(t, admission.LimiterConfig{Initial: 10, Max: 10, OnChange: rec.record})

	// Three permits of the same window all see a 429: one decrease.
	same := []*admission.Permit{acquire(t, l, admission.Batch), acquire(t, l, admission.Batch), acquire(t, l, admission.Batch)}
	for _, p := range same {
		p.Release(admission.Signal{Kind: admission.RateLimited})
	}
	if s := l.Stats(); s.Limit != 9 || s.Decreases != 1 {
		t.Fatalf("after three 429s of one window: limit %d, %d decreases; want 9, 1", s.Limit, s.Decreases)
	}

	// Permits acquired after the decrease decrease again.
	acquire(t, l, admission.Batch).Release(admission.Signal{Kind: admission.RateLimited}) // 8.1
	acquire(t, l, admission.Batch).Release(admission.Signal{Kind: admission.RateLimited}) // 7.29
	acquire(t, l, admission.Batch).Release(admission.Signal{Kind: admission.Timeout})     // 6.561
	acquire(t, l, admission.Batch).Release(admission.Signal{Kind: admission.Timeout})     // 5.9049
	acquire(t, l, admission.Batch).Release(admission.Signal{Kind: admission.Ignore})
	s := l.Stats()
	if s.Limit != 5 || s.Decreases != 5 || s.Target < 5.9 || s.Target > 5.91 {
		t.Fatalf("stats = %+v, want limit 5 (5.9049), 5 decreases", s)
	}
	equal(t, "changes", rec.list(), []string{
		"10→9 rate_limited", "9→8 rate_limited", "8→7 rate_limited", "7→6 timeout", "6→5 timeout",
	})
}

func TestLimiterDecreaseResetsGrowth(t *testing.T) {
	t.Parallel()
	clk := newClock()
	l := newLimiter(t, admission.LimiterConfig{Initial: 5, Max: 10, Now: clk.Now})
	for range 49 { // one short of growing
		call(t, l, clk, admission.Success, time.Second)
	}
	call(t, l, clk, admission.RateLimited, 0) // 4.5
	for range 39 {
		call(t, l, clk, admission.Success, time.Second)
	}
	if got := l.Limit(); got != 4 {
		t.Fatalf("39 successes after the decrease: Limit() = %d, want 4", got)
	}
	call(t, l, clk, admission.Success, time.Second)
	if s := l.Stats(); s.Limit != 5 || s.Target != 5.5 {
		t.Fatalf("40 successes after the decrease: limit %d (%v), want 5 (5.5)", s.Limit, s.Target)
	}
}

func TestLimiterNeverBelowMin(t *testing.T) {
	t.Parallel()
	rec := &changes{}
	l := newLimiter(t, admission.LimiterConfig{Initial: 4, Min: 3, Max: 8, OnChange: rec.record})
	for range 50 {
		acquire(t, l, admission.Interactive).Release(admission.Signal{Kind: admission.RateLimited})
		if s := l.Stats(); s.Limit < 3 || s.Target < 3 {
			t.Fatalf("limit %d (%v) below Min 3", s.Limit, s.Target)
		}
	}
	equal(t, "changes", rec.list(), []string{"4→3 rate_limited"})
}

// A provider's latency triples for good: the limit shrinks for latency,
// the baseline follows and the limit grows again.
func TestLimiterFollowsPermanentLatencyChange(t *testing.T) {
	t.Parallel()
	clk, rec := newClock(), &changes{}
	l := newLimiter(t, admission.LimiterConfig{Initial: 6, Max: 20, Now: clk.Now, OnChange: rec.record})
	for range 100 {
		call(t, l, clk, admission.Success, 100*time.Millisecond)
	}
	if s := l.Stats(); s.Limit != 7 || s.Decreases != 0 || s.Baseline != 100*time.Millisecond {
		t.Fatalf("after 10s at 100ms: %+v, want limit 7, no decrease, baseline 100ms", s)
	}

	step := clk.Now()
	lowest, cuts, lastCut := l.Limit(), uint64(0), time.Duration(0)
	for clk.Now().Sub(step) < 90*time.Second {
		call(t, l, clk, admission.Success, 300*time.Millisecond)
		s := l.Stats()
		if s.Decreases > cuts {
			cuts, lastCut = s.Decreases, clk.Now().Sub(step)
		}
		lowest = min(lowest, s.Limit)
	}
	s := l.Stats()
	t.Logf("after the step: %d latency decreases, the last %v after it; lowest limit %d, now %d; baseline %v short %v",
		cuts, lastCut, lowest, s.Limit, s.Baseline, s.Short)
	t.Logf("changes: %q", rec.list())
	if cuts == 0 || lowest >= 7 {
		t.Fatalf("rising latency did not shrink the limit (lowest %d)", lowest)
	}
	if lastCut > 15*time.Second {
		t.Fatalf("latency still counted as congestion %v after a permanent change", lastCut)
	}
	if d := s.Baseline - 300*time.Millisecond; d < -3*time.Millisecond || d > 3*time.Millisecond {
		t.Fatalf("baseline %v has not followed to 300ms", s.Baseline)
	}
	got := rec.list()
	if got[1] != "7→6 latency" || !strings.HasSuffix(got[len(got)-1], " growth") || s.Limit <= lowest {
		t.Fatalf("want latency decreases then growth again; changes %q", got)
	}
	for _, c := range got[1:] {
		if !strings.HasSuffix(c, " latency") && !strings.HasSuffix(c, " growth") {
			t.Fatalf("unexpected change %q", c)
		}
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: 2})
	a, b := acquire(t, l, admission.Interactive), acquire(t, l, admission.Interactive)
	a.Release(admission.Signal{Kind: admission.RateLimited})
	a.Release(admission.Signal{Kind: admission.RateLimited})
	a.Release(admission.Signal{Kind: admission.Success, Latency: time.Second})
	if s := l.Stats(); s.InFlight != 1 || s.Decreases != 1 {
		t.Fatalf("after releasing one of two permits thrice: %+v, want 1 in flight, 1 decrease", s)
	}
	b.Release(admission.Signal{})
	if s := l.Stats(); s.InFlight != 0 {
		t.Fatalf("in flight %d, want 0", s.InFlight)
	}
}

type result struct {
	p   *admission.Permit
	err error
}

// goAcquire starts an Acquire on its own goroutine.
func goAcquire(ctx context.Context, l *admission.Limiter, lane string) chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := l.Acquire(ctx, lane)
		ch <- result{p, err}
	}()
	return ch
}

// done returns the result of a finished goAcquire, failing if it is still
// waiting; waiting fails if it has finished.
func done(t *testing.T, name string, ch chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	default:
		t.Fatalf("%s is still waiting", name)
		return result{}
	}
}

func waiting(t *testing.T, name string, ch chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s got (%v, %v), want it waiting", name, r.p, r.err)
	default:
	}
}

func TestCanceledWaiterLeaksNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, admission.LimiterConfig{Initial: 1, Max: 1})
		held := acquire(t, l, admission.Interactive)

		ctx, cancel := context.WithCancel(t.Context())
		ch := goAcquire(ctx, l, admission.Interactive)
		synctest.Wait()
		if s := l.Stats(); s.Waiting.Interactive != 1 {
			t.Fatalf("waiting = %+v, want one interactive", s.Waiting)
		}
		cancel()
		synctest.Wait()
		if r := done(t, "canceled waiter", ch); !errors.Is(r.err, context.Canceled) || r.p != nil {
			t.Fatalf("canceled waiter got (%v, %v), want context.Canceled", r.p, r.err)
		}
		if s := l.Stats(); s.InFlight != 1 || s.Waiting != (admission.LaneCounts{}) {
			t.Fatalf("after cancel: %+v, want 1 in flight, nobody waiting", s)
		}

		// A deadline ends a wait the same way.
		dctx, dcancel := context.WithTimeout(t.Context(), time.Second)
		defer dcancel()
		if _, err := l.Acquire(dctx, admission.Batch); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire past deadline: %v", err)
		}

		held.Release(admission.Signal{})
		acquire(t, l, admission.Batch).Release(admission.Signal{})
		if s := l.Stats(); s.InFlight != 0 {
			t.Fatalf("in flight %d, want 0", s.InFlight)
		}

		// An already canceled context gets nothing, even with room.
		if _, err := l.Acquire(ctx, admission.Interactive); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with a canceled context: %v", err)
		}
	})
}

// A waiter whose context ends as a permit is handed to it gives the permit
// back. Which of the two happens first is up to the scheduler; neither may
// leak.
func TestPermitGrantedToCanceledWaiterReturns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, admission.LimiterConfig{Initial: 1, Max: 1})
		for range 200 {
			held := acquire(t, l, admission.Interactive)
			ctx, cancel := context.WithCancel(t.Context())
			ch := goAcquire(ctx, l, admission.Interactive)
			synctest.Wait()
			cancel()
			held.Release(admission.Signal{})
			synctest.Wait()
			if r := done(t, "waiter", ch); !errors.Is(r.err, context.Canceled) {
				t.Fatalf("canceled waiter got (%v, %v)", r.p, r.err)
			}
			if s := l.Stats(); s.InFlight != 0 || s.Waiting != (admission.LaneCounts{}) {
				t.Fatalf("after cancel and release: %+v, want nothing in flight or waiting", s)
			}
		}
	})
}

func TestInteractiveServedFirstAndBatchReserve(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		l := newLimiter(t, admission.LimiterConfig{Initial: 4, Max: 4}) // BatchReserve 1
		b1, b2, b3 := acquire(t, l, admission.Batch), acquire(t, l, admission.Batch), acquire(t, l, admission.Batch)
		b4 := goAcquire(ctx, l, admission.Batch)
		synctest.Wait()
		waiting(t, "b4 (reserve)", b4)

		i1 := acquire(t, l, admission.Interactive) // the reserved permit
		i2 := goAcquire(ctx, l, admission.Interactive)
		synctest.Wait()
		b5 := goAcquire(ctx, l, "sweep") // an unknown lane is batch
		synctest.Wait()
		waiting(t, "i2", i2)
		if s := l.Stats(); s.InFlight != 4 || s.Waiting != (admission.LaneCounts{Interactive: 1, Batch: 2}) {
			t.Fatalf("stats = %+v", s)
		}

		time.Sleep(time.Second)
		b1.Release(admission.Signal{})
		synctest.Wait()
		r2 := done(t, "i2", i2)
		waiting(t, "b4", b4)
		if s := l.Stats(); s.PermitWaits.Interactive != 1 || s.PermitWaited.Interactive != time.Second || s.PermitWaits.Batch != 0 {
			t.Fatalf("permit waits %+v for %+v, want one interactive wait of 1s", s.PermitWaits, s.PermitWaited)
		}

		// Three in flight, nobody interactive waiting: batch still leaves the
		// last permit alone.
		b2.Release(admission.Signal{})
		synctest.Wait()
		waiting(t, "b4 with 3 of 4 in flight", b4)

		i1.Release(admission.Signal{})
		synctest.Wait()
		r4 := done(t, "b4", b4)
		waiting(t, "b5", b5)

		r2.p.Release(admission.Signal{})
		synctest.Wait()
		r5 := done(t, "b5", b5)

		for _, p := range []*admission.Permit{b3, r4.p, r5.p} {
			p.Release(admission.Signal{})
		}
		if s := l.Stats(); s.InFlight != 0 {
			t.Fatalf("in flight %d, want 0", s.InFlight)
		}
	})
}

func TestBatchWhenLimitWithinReserve(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		l := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: 2, BatchReserve: 2})
		b1 := acquire(t, l, admission.Batch) // nothing in flight: batch may take one
		b2 := goAcquire(ctx, l, admission.Batch)
		synctest.Wait()
		waiting(t, "second batch", b2)
		i1 := acquire(t, l, admission.Interactive)
		i2 := goAcquire(ctx, l, admission.Interactive)
		synctest.Wait()

		b1.Release(admission.Signal{})
		synctest.Wait()
		r := done(t, "interactive", i2)
		waiting(t, "second batch", b2)
		i1.Release(admission.Signal{})
		r.p.Release(admission.Signal{})
		synctest.Wait()
		done(t, "second batch", b2).p.Release(admission.Signal{})
	})
}

func TestWaitersOfALaneAreFIFO(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, admission.LimiterConfig{Initial: 1, Max: 1, BatchReserve: -1})
		for _, lane := range []string{admission.Interactive, admission.Batch} {
			held := acquire(t, l, lane)
			var chs []chan result
			for range 4 {
				chs = append(chs, goAcquire(t.Context(), l, lane))
				synctest.Wait()
			}
			for i, ch := range chs {
				held.Release(admission.Signal{})
				synctest.Wait()
				held = done(t, fmt.Sprintf("%s waiter %d", lane, i), ch).p
				for _, later := range chs[i+1:] {
					waiting(t, "a later waiter", later)
				}
			}
			held.Release(admission.Signal{})
		}
	})
}

func TestGrowthWakesWaiters(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		l := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: 4, GrowthWindows: 1})
		a, b := acquire(t, l, admission.Interactive), acquire(t, l, admission.Interactive)
		c, d, e := goAcquire(ctx, l, admission.Interactive), goAcquire(ctx, l, admission.Interactive), goAcquire(ctx, l, admission.Interactive)
		synctest.Wait()
		ok := admission.Signal{Kind: admission.Success, Latency: time.Millisecond}
		a.Release(ok) // 1 of 2 clean successes
		synctest.Wait()
		if s := l.Stats(); s.Limit != 2 || s.InFlight != 2 || s.Waiting.Interactive != 2 {
			t.Fatalf("after one success: %+v", s)
		}
		b.Release(ok) // grows to 3: b's permit and the new one
		synctest.Wait()
		if s := l.Stats(); s.Limit != 3 || s.InFlight != 3 || s.Waiting.Interactive != 0 {
			t.Fatalf("after growth: %+v, want limit 3, 3 in flight, nobody waiting", s)
		}
		for _, ch := range []chan result{c, d, e} {
			r := <-ch
			r.p.Release(admission.Signal{})
		}
	})
}

func TestEnterBoundsHandSlots(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		l := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: 2}) // Headroom 2, BatchReserve 1
		enter := func(lane string) func() {
			leave, err := l.Enter(ctx, lane)
			if err != nil {
				t.Fatalf("Enter(%s): %v", lane, err)
			}
			return leave
		}
		goEnter := func(lane string) chan func() {
			ch := make(chan func(), 1)
			go func() {
				leave, err := l.Enter(ctx, lane)
				if err != nil {
					t.Errorf("Enter(%s): %v", lane, err)
				}
				ch <- leave
			}()
			return ch
		}
		// Each lane has slots of its own: batch 2+2-1 = 3, interactive 4.
		var leaves []func()
		for range 3 {
			leaves = append(leaves, enter(admission.Batch))
		}
		batch := goEnter(admission.Batch)
		synctest.Wait()
		var inter []func()
		for range 4 { // a full batch lane keeps no interactive message out
			inter = append(inter, enter(admission.Interactive))
		}
		interWaiting := goEnter(admission.Interactive)
		synctest.Wait()
		if s := l.Stats(); s.InHand != 7 || s.Entering != (admission.LaneCounts{Interactive: 1, Batch: 1}) {
			t.Fatalf("stats = %+v, want 7 in hand (3 batch, 4 interactive), one waiting per lane", s)
		}
		// Hand slots and permits are counted apart.
		acquire(t, l, admission.Interactive).Release(admission.Signal{})

		inter[0]()
		inter[0]() // idempotent
		synctest.Wait()
		if s := l.Stats(); s.InHand != 7 || s.Entering != (admission.LaneCounts{Batch: 1}) {
			t.Fatalf("after one interactive leave: %+v, want the interactive waiter in and batch still waiting", s)
		}
		inter = append(inter, <-interWaiting)
		leaves[0]()
		synctest.Wait()
		leaves = append(leaves, <-batch)
		for _, leave := range append(leaves, inter...) {
			leave()
		}
		if s := l.Stats(); s.InHand != 0 {
			t.Fatalf("in hand %d, want 0", s.InHand)
		}

		none := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: 2, Headroom: -1})
		a, _ := none.Enter(ctx, admission.Interactive)
		b, _ := none.Enter(ctx, admission.Interactive)
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := none.Enter(short, admission.Interactive); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("third Enter without headroom: %v", err)
		}
		a()
		b()
	})
}

// Many goroutines on real time: never more permits in flight than the limit,
// never more messages in hand than limit + headroom per lane, nothing leaked.
func TestPermitsUnderConcurrency(t *testing.T) {
	t.Parallel()
	const maxLimit, headroom = 12, 2
	l := newLimiter(t, admission.LimiterConfig{Initial: 2, Max: maxLimit, Headroom: headroom, GrowthWindows: 1})
	run := func(congested bool) {
		var inFlight atomic.Int64
		var inHand [2]atomic.Int64 // by lane
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 1))
				lane := admission.Batch
				if g%3 == 0 {
					lane = admission.Interactive
				}
				for range 150 {
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if rng.IntN(4) == 0 {
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(200))*time.Microsecond)
					}
					leave, err := l.Enter(ctx, lane)
					if err != nil {
						cancel()
						continue
					}
					held := &inHand[1]
					if lane == admission.Interactive {
						held = &inHand[0]
					}
					if n := held.Add(1); n > maxLimit+headroom {
						t.Errorf("%d of lane %s in hand, above Max+Headroom", n, lane)
					}
					p, err := l.Acquire(ctx, lane)
					if err == nil {
						n := inFlight.Add(1)
						if lim := l.Limit(); !congested && n > int64(lim) {
							t.Errorf("%d in flight, limit %d", n, lim)
						}
						if n > maxLimit {
							t.Errorf("%d in flight, above Max", n)
						}
						runtime.Gosched()
						inFlight.Add(-1)
						s := admission.Signal{Kind: admission.Success, Latency: time.Millisecond}
						switch r := rng.IntN(20); {
						case r == 0:
							s = admission.Signal{Kind: admission.Ignore}
						case r == 1 && congested:
							s = admission.Signal{Kind: admission.RateLimited}
						}
						p.Release(s)
						p.Release(s)
					}
					held.Add(-1)
					leave()
					cancel()
				}
			})
		}
		wg.Wait()
	}
	run(false) // the limit only grows: in flight never exceeds Limit()
	run(true)
	s := l.Stats()
	t.Logf("final stats: %+v", s)
	if s.InFlight != 0 || s.InHand != 0 || s.Waiting != (admission.LaneCounts{}) || s.Entering != (admission.LaneCounts{}) {
		t.Fatalf("leaked: %+v", s)
	}
}

func TestLimiterConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  admission.LimiterConfig
		want string
	}{
		{admission.LimiterConfig{}, "Max"},
		{admission.LimiterConfig{Max: 4, Min: 5}, "Min"},
		{admission.LimiterConfig{Max: 4, Min: -1}, "Min"},
		{admission.LimiterConfig{Max: 4, Initial: 5}, "Initial"},
		{admission.LimiterConfig{Max: 4, Min: 2, Initial: 1}, "Initial"},
		{admission.LimiterConfig{Max: 4, Decrease: 1}, "Decrease"},
		{admission.LimiterConfig{Max: 4, Decrease: -0.5}, "Decrease"},
		{admission.LimiterConfig{Max: 4, GrowthWindows: -1}, "GrowthWindows"},
		{admission.LimiterConfig{Max: 4, LatencyTolerance: 1}, "LatencyTolerance"},
	} {
		_, err := admission.NewLimiter(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "LimiterConfig."+tc.want) {
			t.Errorf("NewLimiter(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	for _, tc := range []struct {
		cfg  admission.LimiterConfig
		want int
	}{
		{admission.LimiterConfig{Max: 1}, 1},
		{admission.LimiterConfig{Max: 3}, 3},
		{admission.LimiterConfig{Max: 100}, 4},
		{admission.LimiterConfig{Max: 100, Min: 6}, 6},
	} {
		if got := newLimiter(t, tc.cfg).Limit(); got != tc.want {
			t.Errorf("NewLimiter(%+v).Limit() = %d, want %d", tc.cfg, got, tc.want)
		}
	}
}

func ExampleLimiter() {
	l, err := admission.NewLimiter(admission.LimiterConfig{
		Max: 8, // starts at 4
		OnChange: func(old, new int, reason string) {
			fmt.Println(old, "→", new, reason)
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var busy []*admission.Permit
	for range 3 { // three calls keep running...
		p, _ := l.Acquire(ctx, admission.Interactive)
		busy = append(busy, p)
	}
	for range 40 { // ...while the fourth answers cleanly 10 windows of 4 times
		p, _ := l.Acquire(ctx, admission.Interactive)
		p.Release(admission.Signal{Kind: admission.Success, Latency: 800 * time.Millisecond})
	}
	for _, p := range busy {
		p.Release(admission.Signal{Kind: admission.Success, Latency: 800 * time.Millisecond})
	}
	p, _ := l.Acquire(ctx, admission.Batch)
	p.Release(admission.Signal{Kind: admission.RateLimited})
	// Output:
	// 4 → 5 growth
	// 5 → 4 rate_limited
}
