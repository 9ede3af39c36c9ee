package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"assay.dev/pkg/devkit/testenv"
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
