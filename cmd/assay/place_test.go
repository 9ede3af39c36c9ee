package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
)

// assay tenant place writes the region's placement map, by default on the
// least loaded registered cell, and assay tenant placement reads it back.
func TestTenantPlace(t *testing.T) {
	t.Setenv("ASSAY_NATS_URL", testenv.NATS(t))
	t.Setenv("ASSAY_REGION", "us")
	ctx := context.Background()
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := tenantCmd(ctx, args, &out); err != nil {
			t.Fatalf("assay tenant %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	if out := run("place", "acme", "--cell", "us-2"); !strings.Contains(out, "tenant acme placed on cell us-2 of region us (was us)") ||
		!strings.Contains(out, "has not registered") {
		t.Errorf("place acme on us-2: %q", out)
	}
	if out := run("place", "initech"); !strings.Contains(out, "placed on cell us ") {
		t.Errorf("place initech with no cell registered: %q; want the region's own cell", out)
	}
	out := run("placement")
	for _, want := range []string{"us-2  (not registered)  1", "acme     us-2", "initech  us"} {
		if !strings.Contains(out, want) {
			t.Errorf("placement lacks %q:\n%s", want, out)
		}
	}
	var out2 bytes.Buffer
	if err := tenantCmd(ctx, []string{"place", "acme", "--cell", "US 2"}, &out2); err == nil {
		t.Error("a cell id with a space and capitals was taken")
	}
}

// assay tenant move moves a settled tenant's history to another cell of
// the region, places it there, and removes it from the cell it left.
func TestTenantMove(t *testing.T) {
	t.Setenv("ASSAY_NATS_URL", testenv.NATS(t))
	t.Setenv("ASSAY_REGION", "us")
	ctx := context.Background()
	urls := map[string]string{}
	stores := map[string]*store.Store{}
	for _, cell := range []string{"us", "us-2"} {
		urls[cell] = testenv.Database(t)
		st, err := store.Open(ctx, urls[cell])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if _, err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := st.AddTenant(ctx, "acme", "us", "acme-token"); err != nil {
			t.Fatal(err)
		}
		stores[cell] = st
	}
	if err := stores["us"].SetRate(ctx, "acme", 1234, 56); err != nil {
		t.Fatal(err)
	}
	w := &store.Work{ID: "w_000000000000000000000001", TenantID: "acme", Region: "us", Contract: "code-review", SchemaVersion: "1",
		TaxonomyVersion: "1", SourceID: "shop/app#1", Revision: "r1", Lane: "batch", Input: `{}`, Digest: "sha256:00",
		DeadlineAt: time.Now().Add(time.Hour), DropReason: "over its rate"}
	if _, _, err := stores["us"].InsertWork(ctx, w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	// The ended work's outcome is announced, as the committer does.
	if _, err := testenv.Pool(t, urls["us"]).Exec(ctx, `UPDATE work SET outcome_announced_at = now() WHERE id = $1`, w.ID); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ASSAY_DATABASE_URL", urls["us"])
	var out bytes.Buffer
	if err := tenantCmd(ctx, []string{"move", "acme", "--to", "us-2", "--to-database-url", urls["us-2"]}, &out); err != nil {
		t.Fatalf("assay tenant move: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "moved acme to us-2") || !strings.Contains(out.String(), "work 1") {
		t.Errorf("move printed:\n%s", out.String())
	}
	got, err := stores["us-2"].GetWork(ctx, w.ID)
	if err != nil || got.State != "dropped" {
		t.Fatalf("the work in us-2: %+v, %v", got, err)
	}
	if _, err := stores["us"].GetWork(ctx, w.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the work in us after the move: %v, want ErrNotFound", err)
	}
	tn, err := stores["us-2"].TenantByToken(ctx, "acme-token")
	if err != nil || tn.RatePerMinute != 1234 || tn.Burst != 56 {
		t.Errorf("acme in us-2: %+v, %v; want its rate 1234/56 from us", tn, err)
	}
	out.Reset()
	if err := tenantCmd(ctx, []string{"placement"}, &out); err != nil || !regexp.MustCompile(`(?m)^acme\s+us-2$`).MatchString(out.String()) {
		t.Errorf("placement after the move (%v):\n%s", err, out.String())
	}
	// Moving it to the cell that serves it is refused.
	t.Setenv("ASSAY_DATABASE_URL", urls["us-2"])
	if err := tenantCmd(ctx, []string{"move", "acme", "--to", "us-2", "--to-database-url", urls["us-2"]}, &out); err == nil {
		t.Error("a move to the cell that serves the tenant was taken")
	}
}
