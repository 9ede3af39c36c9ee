package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cli"
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
	moved := regexp.MustCompile(`moved t1 from (us(?:-\d)?) to (us(?:-\d)?) under the load`).FindStringSubmatch(s)
	if !strings.Contains(s, "work in all cells: 60 of 60 posted") || moved == nil {
		t.Fatalf("bench cells printed:\n%s", s)
	}
	// Three tenants a cell by the default rule, and then t1 moved.
	for _, cell := range []string{"us", "us-2", "us-3"} {
		want := map[string]int{moved[1]: 2, moved[2]: 4}[cell]
		if want == 0 {
			want = 3
		}
		if !regexp.MustCompile(`(?m)^\s*` + cell + `\s+` + strconv.Itoa(want) + `\s+`).MatchString(s) {
			t.Errorf("cell %s does not serve %d of the 9 tenants after the move from %s to %s:\n%s", cell, want, moved[1], moved[2], s)
		}
	}
	for _, bad := range []error{
		benchCells(context.Background(), []string{"--cells", "1"}, &out),
		benchCells(context.Background(), []string{"--tenants", "2"}, &out),
	} {
		if _, ok := bad.(cli.ConfigError); !ok {
			t.Errorf("a bad flag: %v, want a cli.ConfigError", bad)
		}
	}
}
