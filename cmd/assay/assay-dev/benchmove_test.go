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

// benchMoveLine is the line assay-dev bench move prints, its figures grouped.
var benchMoveLine = regexp.MustCompile(`(?m)^during the moves (\d+) requests, (\d+) non-2xx \((\d+) of (\d+) in all\); ` +
	`work lost (\d+), duplicated (\d+) \((\d+) rows left in (\S+)\); ` +
	`model calls (\S+) (\d+) \+ (\S+) (\d+) = (\d+) \(the sim saw (\d+)\) against (\d+) ledger rows in (\S+); ` +
	`move 1 (\S+) \(held (\S+)\), move 2 (\S+) \(held (\S+)\); p99 (\S+) during the moves against (\S+) before$`)

// A small run: the tenant goes to us-2 and back under the load, the line
// is printed and parses, and no work is lost or made twice. How many
// requests were refused during the moves is what the bench is for, and is
// not held here.
func TestBenchMove(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	var out bytes.Buffer
	args := []string{"--model-latency", "2s", "--duration", "4s", "--rate", "4", "--move-after", "2s", "--wait", "2m"}
	if err := benchMove(context.Background(), args, &out); err != nil {
		t.Fatalf("bench move: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log(s)
	if !strings.HasPrefix(s, "bench move: tenant t1 of region us moved us → us-2 → us") {
		t.Errorf("bench move's first line does not name the moves:\n%s", s)
	}
	m := benchMoveLine.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("bench move printed no line of its figures:\n%s", s)
	}
	n := func(i int) int {
		v, err := strconv.Atoi(m[i])
		if err != nil {
			t.Fatalf("figure %d %q: %v", i, m[i], err)
		}
		return v
	}
	for _, i := range []int{17, 18, 19, 20, 21, 22} {
		if _, err := time.ParseDuration(m[i]); err != nil {
			t.Errorf("figure %d %q is not a duration: %v", i, m[i], err)
		}
	}
	if n(1) == 0 || n(2) > n(1) || n(3) > n(4) || n(4) < 16 {
		t.Errorf("requests: %s during the moves, %s of them non-2xx, %s of %s in all", m[1], m[2], m[3], m[4])
	}
	if n(5) != 0 || n(6) != 0 || n(7) != 0 {
		t.Errorf("work lost %s, duplicated %s, %s rows left in %s; want none", m[5], m[6], m[7], m[8])
	}
	if m[16] != "us" || m[8] != "us-2" || m[9] != "us" || m[11] != "us-2" {
		t.Errorf("the tenant ends on %s (rows left in %s), calls of %s and %s; want us, us-2", m[16], m[8], m[9], m[11])
	}
	if n(13) == 0 || n(13) != n(10)+n(12) || n(14) != n(13) {
		t.Errorf("model calls %s + %s = %s, the sim saw %s", m[10], m[12], m[13], m[14])
	}
	for _, bad := range [][]string{{"--rate", "0"}, {"--webhooks", "2"}, {"--duration", "0s"}, {"extra"}} {
		if _, ok := benchMove(context.Background(), bad, &out).(cli.ConfigError); !ok {
			t.Errorf("bench move %v: want a cli.ConfigError", bad)
		}
	}
}
