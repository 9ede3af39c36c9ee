package natsconf

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
)

// Two cells of a region, each in its own account, share one placement map
// through their region's account: each cell's ingress registers where it
// answers and sees the other, writes no key but its own, and an operator
// places and holds tenants. A cell's service users, and the cell of
// another region, do not reach that map.
func TestARegionsCellsShareThePlacementMap(t *testing.T) {
	dir := t.TempDir()
	cells := []string{"us", "us-2:us", "eu"}
	creds, err := NewCredentials("assay", cells)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range creds {
		t.Setenv(PasswordVar(c.Names, c.Service), c.Password)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := WriteSecrets(SecretFile{path, Render("assay", cells)}); err != nil {
		t.Fatal(err)
	}
	ns := serve(t, path, 3*len(Users)+3*len(RegionUsers))
	srv, err := ParseServer(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	urls := envLines(t, ServiceURLs(creds, srv))
	url := func(cell, user string) string {
		u := urls[URLVar(event.Names{Installation: "assay", Cell: cell}, user)]
		if u == "" {
			t.Fatalf("no URL for %s's %s user", cell, user)
		}
		return u
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	bucket := event.Names{Installation: "assay"}.PlacementBucket("us")
	views := map[string]*placement.View{}
	for _, cell := range []string{"us", "us-2"} {
		v := &placement.View{NATSURL: url(cell, Placement), Bucket: bucket, Region: "us", Cell: cell,
			URL: "http://" + cell + ".internal:8080", Log: log}
		if err := v.Start(ctx); err != nil {
			t.Fatalf("%s's view of the region's map: %v", cell, err)
		}
		t.Cleanup(func() { v.Stop(context.Background()) })
		views[cell] = v
	}

	placer, pjs, err := placement.Connect(url("us", Placer), "placer")
	if err != nil {
		t.Fatal(err)
	}
	defer placer.Close()
	kv, err := pjs.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "acme", "us-2"); err != nil {
		t.Fatalf("the operator places a tenant: %v", err)
	}
	if _, err := kv.Put(ctx, "moving.acme", []byte(`"us"`)); err != nil {
		t.Fatalf("the operator holds a moving tenant: %v", err)
	}
	if err := kv.Delete(ctx, "moving.acme"); err != nil {
		t.Fatalf("the operator ends a hold: %v", err)
	}
	for cell, v := range views {
		for {
			snap, err := v.Now()
			if err == nil && snap.Tenants["acme"] == "us-2" && len(snap.Cells) == 2 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never saw both cells and acme on us-2: %+v, %v", cell, snap, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// us-2's ingress writes its own cell's key and no other.
	nc2, js2, err := placement.Connect(url("us-2", Placement), "us-2")
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	kv2, err := js2.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"cell.us", "tenant.acme", "moving.acme"} {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := kv2.Put(pctx, key, []byte(`{}`))
		pcancel()
		if err == nil {
			t.Fatalf("us-2's ingress wrote %s", key)
		}
	}

	// The cells' own users, and a cell of another region, find no such map.
	for _, who := range [][2]string{{"us", "ingress"}, {"us-2", "ingress"}, {"us", Ops}, {"eu", Placement}} {
		nc, err := nats.Connect(url(who[0], who[1]), nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = js.KeyValue(lctx, bucket)
		lcancel()
		nc.Close()
		if err == nil || (!errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, context.DeadlineExceeded) &&
			!errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrPermissionViolation)) {
			t.Fatalf("%s's %s user reached the region's map: %v", who[0], who[1], err)
		}
	}
}
