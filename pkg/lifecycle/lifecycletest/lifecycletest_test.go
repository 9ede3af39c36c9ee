package lifecycletest

import (
	"context"
	"testing"
	"time"

	"assay.dev/pkg/lifecycle"
)

// TestRunningCountsPartLoops: the count Stress compares rises by one while
// a Runner's loop runs and falls back once Stop has waited for it, so a
// part whose Stop did not wait would be caught.
func TestRunningCountsPartLoops(t *testing.T) {
	before := running()
	var r lifecycle.Runner
	release := make(chan struct{})
	if err := r.Go(t.Context(), func(ctx context.Context) { <-ctx.Done(); <-release }); err != nil {
		t.Fatal(err)
	}
	if got := running(); got != before+1 {
		t.Fatalf("running = %d with one loop up, want %d", got, before+1)
	}
	// A Stop that gives up before the loop returns leaves it counted.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	r.Stop(ctx)
	cancel()
	if got := running(); got != before+1 {
		t.Fatalf("running = %d while the loop still runs, want %d", got, before+1)
	}
	close(release)
	r.Stop(t.Context())
	settled(t, before)
}

// TestTicker holds lifecycle.Ticker, the loop of the sweepers, reapers and
// relays, to the contract.
func TestTicker(t *testing.T) {
	Stress(t, func(t *testing.T) lifecycle.Service {
		return &lifecycle.Ticker{Name: "stress", Every: 5 * time.Millisecond, Final: true,
			Pass: func(context.Context) (bool, error) { return false, nil }}
	})
}
