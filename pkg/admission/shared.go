package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KV is what SharedBuckets needs of a JetStream key-value bucket.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// SharedBuckets are token buckets by key held in a key-value bucket, so
// every ingress instance of a cell takes from the same one: a tenant's
// admitted rate holds however many instances serve it. A bucket is the
// time it is full again (the generic cell rate algorithm), written with a
// compare-and-set on the key's revision.
//
// The cost of one Take is bounded: the instance remembers the last value
// and revision it saw, so an uncontended take is one write; a conflict costs
// a read and a write more, at most Tries times. When the key-value bucket
// does not answer, or Tries conflicts in a row, the take falls back to the
// instance's own Local buckets (the rate then holds per instance, not per
// cell) and says so in its error.
type SharedBuckets struct {
	KV    KV
	Local *Buckets
	// Tries bounds the compare-and-set attempts of one take. Default 4.
	Tries int
	// Timeout bounds one take's round trips. Default 250ms.
	Timeout time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time

	mu    sync.Mutex
	seen  map[string]seenBucket
	locks map[string]*sync.Mutex // one take per key at a time in this instance
}

type seenBucket struct {
	full     int64 // unix nanoseconds
	revision uint64
}

// ErrShared wraps why a take fell back to the instance's own buckets.
var ErrShared = errors.New("admission: shared bucket unavailable")

// Take takes one token from key's shared bucket (see Buckets.Take for
// perMinute and burst). err is non-nil only when the answer came from the
// local fallback.
func (b *SharedBuckets) Take(ctx context.Context, key string, perMinute float64, burst int) (ok bool, retryAfter time.Duration, err error) {
	if !(perMinute > 0) {
		return true, 0, nil
	}
	burst = min(max(burst, 1), maxBurst)
	interval := tokenInterval(perMinute, burst)
	tries := b.Tries
	if tries <= 0 {
		tries = 4
	}
	timeout := b.Timeout
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}

	b.mu.Lock()
	if b.seen == nil {
		b.seen, b.locks = map[string]seenBucket{}, map[string]*sync.Mutex{}
	}
	kl := b.locks[key]
	if kl == nil {
		kl = &sync.Mutex{}
		b.locks[key] = kl
	}
	b.mu.Unlock()
	// The instance's own takes of a key go one at a time, so they never
	// conflict with each other: only another instance's take can.
	kl.Lock()
	defer kl.Unlock()
	b.mu.Lock()
	cur, known := b.seen[key]
	b.mu.Unlock()

	var lastErr error
	for range tries {
		if !known {
			e, err := b.KV.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				cur = seenBucket{}
			case err != nil:
				return b.fallback(key, perMinute, burst, err)
			default:
				full, perr := strconv.ParseInt(string(e.Value()), 10, 64)
				if perr != nil {
					full = 0 // an unreadable value is a full bucket; the write below replaces it
				}
				cur = seenBucket{full: full, revision: e.Revision()}
			}
			known = true
		}
		t := now().UnixNano()
		full := max(cur.full, t)
		if wait := time.Duration(full-t) - time.Duration(burst-1)*interval; wait > 0 {
			// Refused: nothing to write. What was seen may be stale, so
			// the next take reads again.
			b.forget(key)
			return false, (wait + time.Millisecond - 1).Truncate(time.Millisecond), nil
		}
		next := full + int64(interval)
		val := []byte(strconv.FormatInt(next, 10))
		var rev uint64
		var err error
		if cur.revision == 0 {
			rev, err = b.KV.Create(ctx, key, val)
		} else {
			rev, err = b.KV.Update(ctx, key, val, cur.revision)
		}
		if err == nil {
			b.mu.Lock()
			b.seen[key] = seenBucket{full: next, revision: rev}
			b.mu.Unlock()
			return true, 0, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return b.fallback(key, perMinute, burst, err)
		}
		// Another instance took first: read what it wrote and try again.
		known, lastErr = false, err
	}
	return b.fallback(key, perMinute, burst, fmt.Errorf("%d conflicting takes in a row: %w", tries, lastErr))
}

func (b *SharedBuckets) forget(key string) {
	b.mu.Lock()
	delete(b.seen, key)
	b.mu.Unlock()
}

func (b *SharedBuckets) fallback(key string, perMinute float64, burst int, cause error) (bool, time.Duration, error) {
	b.forget(key)
	ok, wait := b.Local.Take(key, perMinute, burst)
	return ok, wait, fmt.Errorf("%w: %w", ErrShared, cause)
}
