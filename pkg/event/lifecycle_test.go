package event_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

// TestKeeperLifecycle holds the stream keeper to the contract of every
// part.
func TestKeeperLifecycle(t *testing.T) {
	js := testenv.JetStream(t)
	names := event.Names{Installation: "stress", Cell: "us"}
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &event.Keeper{JS: js, Names: names, Kinds: []string{event.KindWork}, Every: 5 * time.Millisecond,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}
