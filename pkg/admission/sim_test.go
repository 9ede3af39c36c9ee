package admission_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"assay.dev/pkg/admission"
)

// A provider that answers at most capacity calls at once (429 beyond, at
// once) with constant latency, driven for a simulated minute by more workers
// of both lanes than it can serve. Damping keeps the limit at the capacity and 429s rare.
func TestLimiterFindsProviderCapacity(t *testing.T) {
	t.Parallel()
	const (
		capacity = 8
		latency  = 100 * time.Millisecond
		backoff  = 500 * time.Millisecond // after a 429; the classifier releases the message with a delay
		workers  = 3 * capacity
		duration = time.Minute
		warmUp   = 10 * time.Second
	)
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, admission.LimiterConfig{Max: 64}) // starts at 4

		var mu sync.Mutex
		busy, calls, limited := 0, 0, 0
		provider := func() admission.Signal {
			mu.Lock()
			calls++
			if busy >= capacity {
				limited++
				mu.Unlock()
				return admission.Signal{Kind: admission.RateLimited}
			}
			busy++
			mu.Unlock()
			time.Sleep(latency)
			mu.Lock()
			busy--
			mu.Unlock()
			return admission.Signal{Kind: admission.Success, Latency: latency}
		}

		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			lane := admission.Batch
			if w%3 == 0 {
				lane = admission.Interactive
			}
			wg.Go(func() {
				for time.Since(start) < duration {
					p, err := l.Acquire(t.Context(), lane)
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					s := provider()
					p.Release(s)
					if s.Kind == admission.RateLimited {
						time.Sleep(backoff)
					}
				}
			})
		}
		var sum, sumAfter float64
		var n, nAfter int
		lo, hi := 1<<30, 0
		for time.Since(start) < duration {
			time.Sleep(10 * time.Millisecond)
			lim := l.Limit()
			sum += float64(lim)
			n++
			if time.Since(start) >= warmUp {
				sumAfter += float64(lim)
				nAfter++
				lo, hi = min(lo, lim), max(hi, lim)
			}
		}
		wg.Wait()

		mean, meanAfter := sum/float64(n), sumAfter/float64(nAfter)
		share := float64(limited) / float64(calls)
		s := l.Stats()
		t.Logf("capacity %d: mean limit %.2f over the minute, %.2f after %v (range %d..%d); %d calls, %d rate limited (%.2f%%); %d decreases, %d increases",
			capacity, mean, meanAfter, warmUp, lo, hi, calls, limited, 100*share, s.Decreases, s.Increases)
		if mean < capacity-1 || mean > capacity+1 || meanAfter < capacity-1 || meanAfter > capacity+1 {
			t.Errorf("mean limit %.2f (%.2f after warm-up), want within [%d, %d]", mean, meanAfter, capacity-1, capacity+1)
		}
		if share > 0.05 {
			t.Errorf("%.2f%% of calls rate limited, want at most 5%%", 100*share)
		}
	})
}
