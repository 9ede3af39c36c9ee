package placement_test

import (
	"io"
	"log/slog"
	"testing"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
	"assay.dev/pkg/placement"
)

// TestViewLifecycle holds the placement view, which watches the region's
// map and registers its cell, to the contract of every part.
func TestViewLifecycle(t *testing.T) {
	js := connect(t)
	if _, err := placement.Bucket(t.Context(), js, "t_placement_stress", 1); err != nil {
		t.Fatal(err)
	}
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &placement.View{JS: js, Bucket: "t_placement_stress", Region: "us", Cell: "us", URL: "http://10.0.0.1:8080",
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}
