package outbox_test

import (
	"log/slog"
	"testing"
	"time"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
	"assay.dev/pkg/outbox"
)

// TestRelayLifecycle holds the relay to the contract of every part.
func TestRelayLifecycle(t *testing.T) {
	b := setup(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Every: 5 * time.Millisecond}
	})
}
