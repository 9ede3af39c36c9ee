package admission

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

// instance is one classifier instance as the cell's ceiling sees it: its
// own NATS connection, its own limiter, the cell's slots.
type instance struct {
	nc    *nats.Conn
	slots *CellSlots
	lim   *Limiter
}

func newInstance(t *testing.T, url, bucket string, ceiling, local int, ttl time.Duration, name string) *instance {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	slots := &CellSlots{Open: OpenSlots(js, bucket, ttl, event.StreamSettings{}), Size: ceiling, Holder: name, TTL: ttl}
	t.Cleanup(slots.Stop)
	lim, err := NewLimiter(LimiterConfig{Initial: local, Min: local, Max: local, Cell: slots})
	if err != nil {
		t.Fatal(err)
	}
	return &instance{nc: nc, slots: slots, lim: lim}
}

// Three classifier instances, each on its own NATS connection and each
// allowed 8 calls of its own, share a cell ceiling of 6: however their
// calls interleave, no more than 6 are ever in flight in the cell, and the
// cell does reach 6 (the ceiling is used, not merely never passed).
// Without the shared slots the three would make up to 12 at once (their
// four callers each).
func TestCellSlotsHoldAcrossInstances(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	const ceiling, local, callers = 6, 8, 4
	var insts []*instance
	for i := range 3 {
		insts = append(insts, newInstance(t, url, "calls_test_hold", ceiling, local, 5*time.Second, fmt.Sprintf("classifier-%d", i)))
	}
	var inFlight, peak, calls atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, in := range insts {
		for range callers {
			wg.Go(func() {
				for range 3 {
					p, err := in.lim.Acquire(ctx, Interactive)
					if err != nil {
						t.Error(err)
						return
					}
					n := inFlight.Add(1)
					for {
						old := peak.Load()
						if n <= old || peak.CompareAndSwap(old, n) {
							break
						}
					}
					// The call: long beside a slot's round trips, and, on a
					// loaded machine where they are slow, as long as it takes
					// the others to fill the ceiling once.
					time.Sleep(300 * time.Millisecond)
					for end := time.Now().Add(5 * time.Second); peak.Load() < ceiling && time.Now().Before(end); {
						time.Sleep(5 * time.Millisecond)
					}
					inFlight.Add(-1)
					calls.Add(1)
					p.Release(Signal{Kind: Success, Latency: 300 * time.Millisecond})
				}
			})
		}
	}
	wg.Wait()
	if got := calls.Load(); got != 3*callers*3 {
		t.Fatalf("%d calls made, want %d", got, 3*callers*3)
	}
	if p := peak.Load(); p > ceiling || p < ceiling {
		t.Errorf("at most %d calls were in flight in the cell, want exactly the ceiling %d", p, ceiling)
	}
	for i, in := range insts {
		if h := in.slots.Held(); h != 0 {
			t.Errorf("instance %d still holds %d slots after every call ended", i, h)
		}
	}
	t.Logf("%d calls through three instances, at most %d at once (ceiling %d, %d per instance)", calls.Load(), peak.Load(), ceiling, local)
}

// An instance that dies holding slots (its connection gone, no refresh)
// loses them once the bucket's TTL passes: the others get the whole
// ceiling back, and never more than it meanwhile.
func TestCellSlotsOfADeadInstanceComeFree(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	const ceiling = 3
	ttl := 2 * time.Second
	dead := newInstance(t, url, "calls_test_dead", ceiling, ceiling, ttl, "dies")
	alive := newInstance(t, url, "calls_test_dead", ceiling, 10, ttl, "lives")
	for range 2 {
		if _, err := dead.lim.Acquire(t.Context(), Interactive); err != nil {
			t.Fatal(err)
		}
	}
	dead.slots.Stop()
	dead.nc.Close()
	// One slot is left now; the two others come back when the dead ones
	// age out, and not before.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var got []*Permit
	start := time.Now()
	for range ceiling {
		p, err := alive.lim.Acquire(ctx, Interactive)
		if err != nil {
			t.Fatalf("after %s, %d of %d slots: %v", time.Since(start), len(got), ceiling, err)
		}
		got = append(got, p)
	}
	if waited := time.Since(start); waited < ttl/2 {
		t.Errorf("the dead instance's slots came free after %s, before its entries could age out (TTL %s)", waited, ttl)
	}
	short, cancelShort := context.WithTimeout(t.Context(), ttl)
	defer cancelShort()
	if _, err := alive.lim.Acquire(short, Interactive); err == nil {
		t.Error("a fourth call got a slot of a ceiling of three")
	}
	for _, p := range got {
		p.Release(Signal{Kind: Ignore})
	}
}

// A bucket that goes away (a broker that lost its store, a memory bucket
// on a restarted server) is made again by the next take: calls wait
// through the loss, they do not stop for good.
func TestCellSlotsOutliveTheirBucket(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	in := newInstance(t, url, "calls_test_lost", 2, 2, 5*time.Second, "survivor")
	p, err := in.lim.Acquire(t.Context(), Interactive)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := js.DeleteKeyValue(t.Context(), "calls_test_lost"); err != nil {
		t.Fatal(err)
	}
	p.Release(Signal{Kind: Ignore})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 2 {
		if _, err := in.lim.Acquire(ctx, Interactive); err != nil {
			t.Fatalf("take %d after the bucket was deleted: %v", i+1, err)
		}
	}
	if _, err := js.KeyValue(t.Context(), "calls_test_lost"); err != nil {
		t.Errorf("the bucket was not made again: %v", err)
	}
}
