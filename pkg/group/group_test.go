package group_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"assay.dev/pkg/group"
)

// Alone, a request runs at once, in a group of its own.
func TestAloneRunsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var sizes []int
		b := &group.Batch[int, int]{Run: func(_ context.Context, reqs []int) []int {
			sizes = append(sizes, len(reqs))
			out := make([]int, len(reqs))
			for i, r := range reqs {
				out[i] = r * 2
			}
			return out
		}}
		start := time.Now()
		if got := b.Do(t.Context(), 21); got != 42 {
			t.Fatalf("Do(21) = %d, want 42", got)
		}
		if took := time.Since(start); took != 0 {
			t.Fatalf("a lone request waited %v", took)
		}
		if len(sizes) != 1 || sizes[0] != 1 {
			t.Fatalf("groups %v, want one of one", sizes)
		}
	})
}

// Under load, requests that arrive while a group is written share the
// next one, each gets its own result, and no group is over Max; with two
// flushers, two groups run at once.
func TestConcurrentRequestsShareGroups(t *testing.T) {
	t.Parallel()
	for _, flushers := range []int{1, 2} {
		synctest.Test(t, func(t *testing.T) {
			var mu sync.Mutex
			var sizes []int
			var running, most atomic.Int32
			b := &group.Batch[int, int]{Max: 8, Flushers: flushers, Run: func(_ context.Context, reqs []int) []int {
				n := running.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond) // a statement's round trip
				running.Add(-1)
				mu.Lock()
				sizes = append(sizes, len(reqs))
				mu.Unlock()
				out := make([]int, len(reqs))
				for i, r := range reqs {
					out[i] = -r
				}
				return out
			}}
			var wg sync.WaitGroup
			for i := range 100 {
				wg.Go(func() {
					if got := b.Do(context.Background(), i); got != -i {
						t.Errorf("Do(%d) = %d", i, got)
					}
				})
			}
			wg.Wait()
			total := 0
			for _, n := range sizes {
				if n > 8 {
					t.Errorf("a group of %d, over Max 8", n)
				}
				total += n
			}
			if total != 100 || len(sizes) >= 100 {
				t.Fatalf("flushers %d: groups %v: %d requests in %d groups, want 100 in fewer", flushers, sizes, total, len(sizes))
			}
			if int(most.Load()) != flushers {
				t.Fatalf("flushers %d: at most %d groups ran at once", flushers, most.Load())
			}
		})
	}
}

// A caller whose context ends does not cut its group short: the others'
// requests are still run and answered.
func TestCanceledCallerDoesNotCutItsGroup(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var seen atomic.Int32
		b := &group.Batch[int, error]{Run: func(ctx context.Context, reqs []int) []error {
			time.Sleep(time.Millisecond)
			out := make([]error, len(reqs))
			for i := range reqs {
				seen.Add(1)
				out[i] = ctx.Err()
			}
			return out
		}}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				c := context.Background()
				if i == 0 {
					c = ctx
				}
				if err := b.Do(c, i); err != nil {
					t.Errorf("request %d: the group ran with a canceled context: %v", i, err)
				}
			})
		}
		wg.Wait()
		if seen.Load() != 10 {
			t.Fatalf("%d of 10 requests run", seen.Load())
		}
	})
}

// With a Wait, a group that is not full gathers for that long: requests
// arriving within it share one group, a lone request waits exactly Wait,
// and a group that fills is written at once.
func TestWaitGathersUntilFullOrTimeUp(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		var at []time.Duration
		start := time.Now()
		b := &group.Batch[int, int]{Max: 4, Wait: 10 * time.Millisecond, Run: func(_ context.Context, reqs []int) []int {
			mu.Lock()
			sizes, at = append(sizes, len(reqs)), append(at, time.Since(start))
			mu.Unlock()
			return append([]int(nil), reqs...)
		}}
		var wg sync.WaitGroup
		for i, after := range []time.Duration{0, 3 * time.Millisecond, 6 * time.Millisecond} {
			wg.Go(func() {
				time.Sleep(after)
				if got := b.Do(t.Context(), i); got != i {
					t.Errorf("Do(%d) = %d", i, got)
				}
			})
		}
		wg.Wait()
		if len(sizes) != 1 || sizes[0] != 3 || at[0] != 10*time.Millisecond {
			t.Fatalf("groups %v at %v, want one of 3 at 10ms", sizes, at)
		}

		sizes, at, start = nil, nil, time.Now()
		for i := range 4 {
			wg.Go(func() { b.Do(t.Context(), i) })
		}
		wg.Wait()
		if len(sizes) != 1 || sizes[0] != 4 || at[0] != 0 {
			t.Fatalf("a full group: groups %v at %v, want one of 4 at once", sizes, at)
		}

		sizes, at, start = nil, nil, time.Now()
		b.Do(t.Context(), 7)
		if len(sizes) != 1 || at[0] != 10*time.Millisecond {
			t.Fatalf("a lone request: groups %v at %v, want one written after 10ms", sizes, at)
		}
	})
}
