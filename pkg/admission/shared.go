package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
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
// The cost of one Take is bounded: an instance takes tokens from the shared
// bucket a few at a time (a tenth of a second of the rate, at most the
// burst) and hands them out itself for up to Lease, so most takes cost no
// round trip; a take from the shared bucket is one write when the instance
// saw the last value, and a conflict costs a read and a write more, at most
// Tries times. Tokens taken and not handed out within Lease are lost, never
// given twice: the instances together never admit more than the bucket.
// When the key-value bucket does not answer, or Tries conflicts in a row,
// the take falls back to the instance's own Local buckets (the rate then
// holds per instance, not per cell) and says so in its error.
type SharedBuckets struct {
	KV    KV
	Local *Buckets
	// Tries bounds the compare-and-set attempts of one take. Default 4.
	Tries int
	// Timeout bounds one take's round trips. Default 1s.
	Timeout time.Duration
	// Lease is how long tokens taken ahead may be handed out. Default
	// 250ms.
	Lease time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time

	mu   sync.Mutex
	keys map[string]*sharedKey
}

// sharedKey is what one instance knows of one key.
type sharedKey struct {
	mu       sync.Mutex // one take from the shared bucket at a time
	seen     bool
	full     int64 // unix nanoseconds, as last read or written
	revision uint64
	tokens   int       // taken ahead, not yet handed out
	until    time.Time // when those lapse
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
	tries := cmp.Or(b.Tries, 4)
	timeout := cmp.Or(b.Timeout, time.Second)
	lease := cmp.Or(b.Lease, 250*time.Millisecond)
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	// A tenth of a second of the rate at a time, at most the burst.
	chunk := int(min(float64(burst), max(1, math.Floor(perMinute/600))))

	k := b.sharedKey(key)
	// The instance's own takes of a key go one at a time, so they never
	// conflict with each other: only another instance's take can.
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tokens > 0 && now().Before(k.until) {
		k.tokens--
		return true, 0, nil
	}
	k.tokens = 0
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var lastErr error
	for range tries {
		if err := k.read(ctx, b.KV, key); err != nil {
			return b.fallback(key, perMinute, burst, err)
		}
		t := now()
		n, next, wait := k.plan(t.UnixNano(), burst, interval, chunk)
		if n == 0 {
			// What was seen may be stale, so the next take reads again.
			k.seen = false
			return false, wait, nil
		}
		rev, err := k.write(ctx, b.KV, key, next)
		if err == nil {
			k.full, k.revision = next, rev
			k.tokens, k.until = n-1, t.Add(lease)
			return true, 0, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return b.fallback(key, perMinute, burst, err)
		}
		// Another instance took first: read what it wrote and try again.
		k.seen, lastErr = false, err
	}
	return b.fallback(key, perMinute, burst, fmt.Errorf("%d conflicting takes in a row: %w", tries, lastErr))
}

// sharedKey is what the instance knows of key, made on first use.
func (b *SharedBuckets) sharedKey(key string) *sharedKey {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil {
		b.keys = map[string]*sharedKey{}
	}
	k := b.keys[key]
	if k == nil {
		k = &sharedKey{}
		b.keys[key] = k
	}
	return k
}

// read reads key's value and revision from kv unless k holds them already;
// a missing key is an empty bucket. Its error is kv's.
func (k *sharedKey) read(ctx context.Context, kv KV, key string) error {
	if k.seen {
		return nil
	}
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		k.full, k.revision = 0, 0
	case err != nil:
		return err
	default:
		full, perr := strconv.ParseInt(string(e.Value()), 10, 64)
		if perr != nil {
			full = 0 // an unreadable value is a full bucket; the write below replaces it
		}
		k.full, k.revision = full, e.Revision()
	}
	k.seen = true
	return nil
}

// plan decides a take at tn (unix nanoseconds) from the bucket as k last
// saw it: n tokens, at most chunk, and next, when the bucket is full again
// once they are taken; or, with no token left, n 0 and the wait until one
// is.
func (k *sharedKey) plan(tn int64, burst int, interval time.Duration, chunk int) (n int, next int64, wait time.Duration) {
	full := max(k.full, tn)
	// Tokens left: the burst less what refills between now and full.
	left := burst - int((full-tn+int64(interval)-1)/int64(interval))
	if left <= 0 {
		wait := time.Duration(full-tn) - time.Duration(burst-1)*interval
		return 0, 0, (max(wait, time.Millisecond) + time.Millisecond - 1).Truncate(time.Millisecond)
	}
	n = min(chunk, left)
	return n, full + int64(n)*int64(interval), 0
}

// write stores next as key's value with a compare-and-set on the revision k
// last saw (a create when it saw none) and returns the new revision.
func (k *sharedKey) write(ctx context.Context, kv KV, key string, next int64) (uint64, error) {
	val := []byte(strconv.FormatInt(next, 10))
	if k.revision == 0 {
		return kv.Create(ctx, key, val)
	}
	return kv.Update(ctx, key, val, k.revision)
}

// fallback answers from the instance's own bucket; it runs with the key's
// lock held, so what the instance knows of the key is forgotten.
func (b *SharedBuckets) fallback(key string, perMinute float64, burst int, cause error) (bool, time.Duration, error) {
	b.mu.Lock()
	if k := b.keys[key]; k != nil {
		k.seen = false
	}
	b.mu.Unlock()
	ok, wait := b.Local.Take(key, perMinute, burst)
	return ok, wait, fmt.Errorf("%w: %w", ErrShared, cause)
}
