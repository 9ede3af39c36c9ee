package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
)

// A small region, end to end: every review posted is one work item in the
// cell that serves its tenant, every cell serves some tenants, and the
// tenant moved under the load is reported.
func TestBenchCellsSmall(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	// The rates are not what this test looks at: short windows.
	idleWindow, statsLag = 100*time.Millisecond, 0
	var out bytes.Buffer
	if err := benchCells(context.Background(), []string{"--cells", "3", "--tenants", "9", "-n", "60", "--rate", "40"}, &out); err != nil {
		t.Fatalf("bench cells: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log(s)
	if !strings.Contains(s, "work in all cells: 60 of 60 posted") || !regexp.MustCompile(`moved t1 from us(-\d)? to us-\d|moved t1 from us-\d to us`).MatchString(s) {
		t.Errorf("bench cells printed:\n%s", s)
	}
	for _, cell := range []string{"us", "us-2", "us-3"} {
		if !regexp.MustCompile(`(?m)^\s*` + cell + `\s+3\s+`).MatchString(s) {
			t.Errorf("cell %s does not serve 3 of the 9 tenants:\n%s", cell, s)
		}
	}
	for _, bad := range []error{
		benchCells(context.Background(), []string{"--cells", "1"}, &out),
		benchCells(context.Background(), []string{"--tenants", "2"}, &out),
	} {
		if _, ok := bad.(configError); !ok {
			t.Errorf("a bad flag: %v, want a configError", bad)
		}
	}
}
