package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func sharedKV(t *testing.T) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "admit_test", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Two instances on one shared bucket admit, together, the burst and then
// one token per interval: what one bucket would.
func TestSharedBucketsAcrossInstances(t *testing.T) {
	t.Parallel()
	kv := sharedKV(t)
	var clock atomic.Int64
	clock.Store(time.Unix(1_000_000, 0).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	a := &SharedBuckets{KV: kv, Local: NewBuckets(now), Now: now}
	b := &SharedBuckets{KV: kv, Local: NewBuckets(now), Now: now}
	ctx := t.Context()
	// 60 per minute: one a second; burst 5.
	admitted := 0
	for i := range 20 {
		inst := a
		if i%2 == 1 {
			inst = b
		}
		ok, _, err := inst.Take(ctx, "rate.acme.interactive", 60, 5)
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of 20 at once across two instances, want the burst of 5", admitted)
	}
	ok, wait, err := a.Take(ctx, "rate.acme.interactive", 60, 5)
	if ok || err != nil || wait != time.Second {
		t.Fatalf("over the rate: ok %v wait %v err %v, want refused for 1s", ok, wait, err)
	}
	clock.Add(int64(3 * time.Second))
	admitted = 0
	for i := range 10 {
		inst := a
		if i%2 == 1 {
			inst = b
		}
		if ok, _, err := inst.Take(ctx, "rate.acme.interactive", 60, 5); err != nil {
			t.Fatal(err)
		} else if ok {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("three seconds later: admitted %d, want 3", admitted)
	}
}

// Concurrent takes from many goroutines on two instances never admit more
// than the bucket holds.
func TestSharedBucketsConcurrent(t *testing.T) {
	t.Parallel()
	kv := sharedKV(t)
	fixed := time.Unix(2_000_000, 0)
	now := func() time.Time { return fixed }
	inst := []*SharedBuckets{{KV: kv, Local: NewBuckets(now), Now: now, Tries: 64, Timeout: 5 * time.Second},
		{KV: kv, Local: NewBuckets(now), Now: now, Tries: 64, Timeout: 5 * time.Second}}
	var admitted, fellBack atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 10 {
				ok, _, err := inst[g%2].Take(t.Context(), "rate.busy.batch", 1, 25)
				if err != nil {
					fellBack.Add(1)
					continue
				}
				if ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if fellBack.Load() != 0 {
		t.Fatalf("%d takes fell back to the local bucket", fellBack.Load())
	}
	if admitted.Load() != 25 {
		t.Fatalf("admitted %d of 80 concurrent takes, want the burst of 25", admitted.Load())
	}
}

type brokenKV struct{}

func (brokenKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return nil, errors.New("no responders")
}
func (brokenKV) Create(context.Context, string, []byte, ...jetstream.KVCreateOpt) (uint64, error) {
	return 0, errors.New("no responders")
}
func (brokenKV) Update(context.Context, string, []byte, uint64) (uint64, error) {
	return 0, errors.New("no responders")
}

// Without the key-value bucket the take still answers, from the local
// bucket, and says it fell back.
func TestSharedBucketsFallBack(t *testing.T) {
	b := &SharedBuckets{KV: brokenKV{}, Local: NewBuckets(nil)}
	ok, _, err := b.Take(t.Context(), "rate.acme.interactive", 60, 1)
	if !ok || !errors.Is(err, ErrShared) {
		t.Fatalf("first take: ok %v err %v, want admitted locally with ErrShared", ok, err)
	}
	ok, _, err = b.Take(t.Context(), "rate.acme.interactive", 60, 1)
	if ok || !errors.Is(err, ErrShared) {
		t.Fatalf("second take: ok %v err %v, want refused locally with ErrShared", ok, err)
	}
}

// Tokens are taken ahead a few at a time, and the instances together
// still admit no more than the bucket holds; tokens not handed out within
// the lease lapse.
func TestSharedBucketsLease(t *testing.T) {
	t.Parallel()
	kv := sharedKV(t)
	var clock atomic.Int64
	clock.Store(time.Unix(3_000_000, 0).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	a := &SharedBuckets{KV: kv, Local: NewBuckets(now), Now: now}
	b := &SharedBuckets{KV: kv, Local: NewBuckets(now), Now: now}
	ctx := t.Context()
	take := func(s *SharedBuckets) bool {
		ok, _, err := s.Take(ctx, "rate.lease.interactive", 6000, 10) // 100/s, burst 10: ten at a time
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take(a) {
		t.Fatal("first take refused")
	}
	if take(b) {
		t.Fatal("b admitted while a holds the whole burst")
	}
	for i := range 9 {
		if !take(a) {
			t.Fatalf("a's %d-th token taken ahead was refused", i+2)
		}
	}
	if take(a) {
		t.Fatal("a admitted an eleventh within the burst of 10")
	}
	rev, err := kv.Get(ctx, "rate.lease.interactive")
	if err != nil {
		t.Fatal(err)
	}
	if rev.Revision() != 1 {
		t.Fatalf("ten admissions wrote the shared bucket %d times, want once", rev.Revision())
	}
	clock.Add(int64(time.Second)) // the bucket is full again; a's lease lapsed
	if !take(b) {
		t.Fatal("b refused once the bucket refilled")
	}
}
