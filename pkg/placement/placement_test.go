package placement_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/placement"
)

func connect(t *testing.T) jetstream.JetStream {
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
	return js
}

// A tenant the map does not name is the region's own cell's; a new one
// goes to the registered cell serving the fewest (the lowest id among
// equals), or to the region's cell while none has registered.
func TestChoose(t *testing.T) {
	t.Parallel()
	s := &placement.Snapshot{Region: "us", Tenants: map[string]string{}, Cells: map[string]placement.Cell{}}
	if got := s.Choose(); got != "us" {
		t.Errorf("no cell registered: %q, want us", got)
	}
	s.Cells["us-2"], s.Cells["us"], s.Cells["us-3"] = placement.Cell{ID: "us-2"}, placement.Cell{ID: "us"}, placement.Cell{ID: "us-3"}
	s.Tenants["a"], s.Tenants["b"], s.Tenants["c"] = "us", "us-2", "us"
	if got := s.Choose(); got != "us-3" {
		t.Errorf("loads us 2, us-2 1, us-3 0: %q, want us-3", got)
	}
	s.Tenants["d"] = "us-3"
	if got := s.Choose(); got != "us-2" {
		t.Errorf("loads us 2, us-2 1, us-3 1: %q, want us-2 (the lowest id of the least loaded)", got)
	}
	if got := s.CellOf("zed"); got != "us" {
		t.Errorf("an unplaced tenant is served by %q, want us", got)
	}
}

// A view starts with the map as it is, registers its cell, and hears
// each placement made after; Read sees the same.
func TestViewHearsPlacements(t *testing.T) {
	t.Parallel()
	js := connect(t)
	ctx := context.Background()
	kv, err := placement.Bucket(ctx, js, "t_placement_us", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "acme", "us-2"); err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "Bad Tenant", "us-2"); err == nil {
		t.Error("a tenant id with spaces and capitals was placed")
	}
	v := &placement.View{JS: js, Bucket: "t_placement_us", Region: "us", Cell: "us-2", URL: "http://10.0.0.2:8080",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := v.Start(sctx); err != nil {
		t.Fatal(err)
	}
	defer v.Stop(ctx)
	s, err := v.Now()
	if err != nil || s.CellOf("acme") != "us-2" || s.Cells["us-2"].URL != "http://10.0.0.2:8080" {
		t.Fatalf("the view at its start: %+v, %v", s, err)
	}
	if err := placement.Place(ctx, kv, "acme", "us"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if s, _ := v.Now(); s.CellOf("acme") == "us" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the view did not hear acme moved to us: %+v", s)
		}
	}
	r, err := placement.Read(ctx, kv, "us")
	if err != nil || r.CellOf("acme") != "us" || len(r.Cells) != 1 {
		t.Fatalf("Read: %+v, %v", r, err)
	}
}
