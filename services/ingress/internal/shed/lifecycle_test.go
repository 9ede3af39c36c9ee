package shed

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

// TestCapacityViewLifecycle holds the capacity view, which watches the
// cell's capacity bucket, to the contract of every part.
func TestCapacityViewLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &View{JS: e.js, Bucket: e.names.CapacityBucket(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}

// TestWarmCapacityViewLifecycle is the same with each Stop meeting a view
// that has read the report and watches for more.
func TestWarmCapacityViewLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		v := &View{JS: e.js, Bucket: e.names.CapacityBucket(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		return lifecycletest.Warm(v, func(context.Context) error {
			if v.Rate(time.Now()) == 0 {
				return errNotYet
			}
			return nil
		})
	})
}

// TestCapacityViewWithoutBucketLifecycle is the capacity view of a cell
// whose classifiers have not made the bucket yet: it waits for it until
// stopped.
func TestCapacityViewWithoutBucketLifecycle(t *testing.T) {
	e := lifecycleEnv(t)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		return &View{JS: e.js, Bucket: "assay_capacity_nowhere", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	})
}
