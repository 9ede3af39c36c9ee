package classifier

import (
	"context"
	"runtime"
	"sync"
	"testing"
)

// queueUp holds the lane's turn, queues the messages of tenants in order,
// then lets them go one turn at a time and returns the order they got it.
func queueUp(t *testing.T, weights map[string]int, tenants []string) []string {
	t.Helper()
	f := newFairShare()
	ctx := context.Background()
	hold, err := f.wait(ctx, "holder", 1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, tenant := range tenants {
		wg.Go(func() {
			done, err := f.wait(ctx, tenant, weights[tenant], nil, 0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, tenant)
			mu.Unlock()
			done()
		})
		// Queued in this order: wait until the message is in the queue.
		for {
			if n, _ := f.snapshot(); n == i+1 {
				break
			}
			runtime.Gosched()
		}
	}
	hold()
	wg.Wait()
	return order
}

func TestFairShareNoisyTenantQueuesBehindItself(t *testing.T) {
	var tenants []string
	for range 10 {
		tenants = append(tenants, "noisy")
	}
	tenants = append(tenants, "quiet")
	order := queueUp(t, nil, tenants)
	pos := -1
	for i, tn := range order {
		if tn == "quiet" {
			pos = i
		}
	}
	if pos > 1 {
		t.Fatalf("quiet's one message went %d-th behind noisy's ten: %v", pos+1, order)
	}
}

func TestFairShareByWeight(t *testing.T) {
	var tenants []string
	for range 8 {
		tenants = append(tenants, "heavy", "light")
	}
	order := queueUp(t, map[string]int{"heavy": 3}, tenants)
	heavy := 0
	for _, tn := range order[:8] {
		if tn == "heavy" {
			heavy++
		}
	}
	if heavy != 6 {
		t.Fatalf("of the first 8 turns heavy (weight 3) got %d, want 6: %v", heavy, order)
	}
}

// A message that gives up waiting leaves the queue; the others still get
// their turn.
func TestFairShareCanceledWaiterLeaves(t *testing.T) {
	f := newFairShare()
	hold, err := f.wait(context.Background(), "a", 1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.wait(ctx, "b", 1, nil, 0)
		errc <- err
	}()
	for {
		if n, _ := f.snapshot(); n == 1 {
			break
		}
		runtime.Gosched()
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("canceled wait returned no error")
	}
	if n, by := f.snapshot(); n != 0 || len(by) != 0 {
		t.Fatalf("after the cancel %d wait (%v), want none", n, by)
	}
	hold()
	done, err := f.wait(context.Background(), "c", 1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	done()
}
