package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The whole demo on the test database server: every work item reaches an
// outcome and the ledger matches the provider's count per tenant.
func TestDemoReconciles(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	t.Setenv("ASSAY_MODEL_BASE_URL", "")
	ctx := context.Background()
	e, err := cell.StartDev(ctx, cell.DevOptions{LogTo: io.Discard})
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		t.Fatalf("start dev: %v", err)
	}
	var out bytes.Buffer
	if err := runDemo(ctx, e, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	calls, rows, err := demo{e}.waitLedger(ctx, 30*time.Second) // returns as soon as they match
	if err != nil {
		t.Fatal(err)
	}
	items := len(evalset.Items())
	for _, tenant := range []string{"acme", "globex"} {
		if calls[tenant] == 0 || calls[tenant] != rows[tenant] {
			t.Errorf("%s: provider calls %d, ledger rows %d", tenant, calls[tenant], rows[tenant])
		}
	}
	// acme: every item once; globex: one item answered twice (the forced
	// invalid output and its repair).
	if calls["acme"] != int64(items+2) || calls["globex"] != int64(items+3) {
		t.Errorf("calls %v, want acme %d and globex %d", calls, items+2, items+3)
	}
	for _, want := range []string{"schema_rejected (expected*)", "accepted", "same id: true", "* on purpose: the simulated provider was told to break",
		"schema_rejected 1 (1 on purpose*)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// A demo whose model endpoint answers nothing exits non-zero and names the
// cause, instead of printing a table of retry_exhausted.
func TestDemoNamesAnUnreachableModel(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	t.Setenv("ASSAY_MODEL_BASE_URL", "http://127.0.0.1:1/v1")
	t.Setenv("ASSAY_MODEL", "gpt-4o-mini")
	ctx := context.Background()
	e, err := cell.StartDev(ctx, cell.DevOptions{LogTo: io.Discard})
	if e != nil {
		defer e.Stop()
	}
	if err != nil {
		t.Fatalf("start dev: %v", err)
	}
	var out bytes.Buffer
	err = runDemo(ctx, e, &out)
	if err == nil || !strings.Contains(err.Error(), "no work item reached the model at POST http://127.0.0.1:1/v1/chat/completions") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("demo against a closed port: %v\n%s", err, out.String())
	}
}
