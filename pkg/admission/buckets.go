package admission

import (
	"math"
	"sync"
	"time"
)

// sweepEvery is the fewest takes between sweeps for full buckets; a sweep
// also waits for as many takes as there are buckets, so its cost per take
// stays constant.
const sweepEvery = 1024

// maxBurst bounds a bucket's burst so its arithmetic cannot overflow.
const maxBurst = 1 << 30

// Buckets are token buckets by key, for ingress admission per tenant and
// lane. A bucket starts full and refills continuously. Buckets that would be
// full are forgotten, since a new one starts full anyway.
//
// A bucket is kept as the time it will be full again (the generic cell rate
// algorithm), in whole nanoseconds, so Retry-After is exact.
type Buckets struct {
	now func() time.Time

	mu    sync.Mutex
	m     map[string]*bucket
	takes int // since the last sweep
}

type bucket struct {
	full     time.Time     // when the bucket is full again
	interval time.Duration // time to refill one token
	burst    int
}

// NewBuckets returns empty Buckets reading the clock now (nil means
// time.Now).
func NewBuckets(now func() time.Time) *Buckets {
	if now == nil {
		now = time.Now
	}
	return &Buckets{now: now, m: make(map[string]*bucket)}
}

// Take takes one token from key's bucket, which holds up to burst tokens
// (at least 1, at most 2³⁰) and refills at perMinute. If none is left it returns false
// and the time until one is, rounded up to the millisecond. perMinute <= 0
// means unlimited. A change of rate or burst keeps the tokens the bucket
// holds, capped at the new burst.
func (b *Buckets) Take(key string, perMinute float64, burst int) (ok bool, retryAfter time.Duration) {
	if !(perMinute > 0) {
		return true, 0
	}
	burst = min(max(burst, 1), maxBurst)
	interval := tokenInterval(perMinute, burst)
	now := b.now()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.takes++; b.takes >= max(sweepEvery, len(b.m)) {
		b.sweep(now)
	}
	k, found := b.m[key]
	switch {
	case !found:
		k = &bucket{full: now, interval: interval, burst: burst}
		b.m[key] = k
	case k.interval != interval || k.burst != burst:
		tokens := float64(k.burst) - float64(max(k.full.Sub(now), 0))/float64(k.interval)
		tokens = min(tokens, float64(burst))
		k.full = now.Add(time.Duration(math.Ceil((float64(burst) - tokens) * float64(interval))))
		k.interval, k.burst = interval, burst
	}

	// One token is left while the bucket is full again within burst−1
	// intervals.
	full := k.full
	if full.Before(now) {
		full = now
	}
	if wait := full.Sub(now) - time.Duration(burst-1)*interval; wait > 0 {
		return false, (wait + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	k.full = full.Add(interval)
	return true, 0
}

// Len is the number of buckets remembered.
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

func (b *Buckets) sweep(now time.Time) {
	b.takes = 0
	for key, k := range b.m {
		if !k.full.After(now) {
			delete(b.m, key)
		}
	}
}

// tokenInterval is the time to refill one token, at least 1ns and small
// enough that burst intervals fit in a Duration.
func tokenInterval(perMinute float64, burst int) time.Duration {
	d := math.Round(float64(time.Minute) / perMinute)
	ceiling := float64(math.MaxInt64 / int64(burst+2))
	return time.Duration(max(1, min(d, ceiling)))
}
