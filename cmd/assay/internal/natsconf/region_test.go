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
	"assay.dev/services/committer/publish"
)

// Two cells of a region, each in its own account, share one placement map
// through their region's account: each cell's ingress registers where it
// answers and sees the other, writes no key but its own, and an operator
// places and holds tenants. A cell's service users, and the cell of
// another region, do not reach that map.
func TestARegionsCellsShareThePlacementMap(t *testing.T) {
	urls := serveCells(t, "us", "us-2:us", "eu")
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

// The committers of a region's two cells draw one GitHub write budget per
// installation from their region's account, each with its cell's publisher
// user; a cell's committer user keeps a budget of the cell's own in its
// account; a cell's other users reach neither.
func TestARegionsCellsShareTheGitHubBudget(t *testing.T) {
	urls := serveCells(t, "us", "us-2:us")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	connect := func(cell, user string) jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(urls[URLVar(event.Names{Installation: "assay", Cell: cell}, user)], nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s's %s user: %v", cell, user, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	names := event.Names{Installation: "assay"}
	budget := func(js jetstream.JetStream, bucket string) *publish.Budget {
		return &publish.Budget{PerMinute: 3, PerHour: 10, Open: func(ctx context.Context) (jetstream.KeyValue, error) {
			return event.EnsureBucket(ctx, js, nil, jetstream.KeyValueConfig{Bucket: bucket, History: 1},
				event.StreamSettings{Replicas: 1}.Once())
		}}
	}
	us, us2 := budget(connect("us", Publisher), names.GitHubBucket("us")), budget(connect("us-2", Publisher), names.GitHubBucket("us"))
	for i, b := range []*publish.Budget{us, us, us2} {
		if wait, err := b.Take(ctx, 42); err != nil || wait != 0 {
			t.Fatalf("write %d of 3 a minute: wait %s, %v", i+1, wait, err)
		}
	}
	for name, b := range map[string]*publish.Budget{"us": us, "us-2": us2} {
		if wait, err := b.Take(ctx, 42); err != nil || wait <= 0 {
			t.Fatalf("%s's fourth write of the installation in a minute was let through: wait %s, %v", name, wait, err)
		}
	}
	// Another installation has its own budget.
	if wait, err := us2.Take(ctx, 7); err != nil || wait != 0 {
		t.Fatalf("another installation's write: wait %s, %v", wait, err)
	}
	// The cell's committer keeps its own budget in the cell's account.
	own := budget(connect("us", "committer"), names.GitHubBucket("us"))
	if wait, err := own.Take(ctx, 42); err != nil || wait != 0 {
		t.Fatalf("the cell's own budget, apart from the region's: wait %s, %v", wait, err)
	}
	if kv, err := own.Open(ctx); err != nil || kv.Bucket() != names.GitHubBucket("us") {
		t.Fatalf("the committer's own bucket: %v", err)
	}
	// A cell's ingress reaches neither bucket.
	for _, who := range [][2]string{{"us", Placement}, {"us", "ingress"}} {
		lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := connect(who[0], who[1]).KeyValue(lctx, names.GitHubBucket("us"))
		lcancel()
		if err == nil {
			t.Fatalf("%s's %s user reached a GitHub budget", who[0], who[1])
		}
	}
}

// serveCells serves the cells' accounts file, with fresh passwords, on a
// server of the test's, and returns every user's URL by URLVar.
func serveCells(t *testing.T, cells ...string) map[string]string {
	t.Helper()
	creds, err := NewCredentials("assay", cells)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range creds {
		t.Setenv(PasswordVar(c.Names, c.Service), c.Password)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := WriteSecrets(SecretFile{path, Render("assay", cells)}); err != nil {
		t.Fatal(err)
	}
	ns := serve(t, path, len(cells)*(len(Users)+len(RegionUsers)))
	srv, err := ParseServer(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	return envLines(t, ServiceURLs(creds, srv))
}
