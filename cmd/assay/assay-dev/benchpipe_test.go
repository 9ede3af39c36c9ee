package main

import (
	"bytes"
	"strings"
	"testing"
)

// A bad flag of bench pipeline exits 2 and names it, before anything starts.
func TestBenchPipelineFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "pipeline", "-c", "8,x"}, `-c: "8,x" is not a list of client counts`},
		{[]string{"bench", "pipeline", "-n", "0"}, "-n and --runs must be positive"},
		{[]string{"bench", "pipeline", "--peer", "/nonexistent"}, "--peer: /nonexistent holds no go.mod"},
		{[]string{"bench", "pipeline", "--rate", "-5"}, "--rate: -5 is not from 0 to 100000"},
		{[]string{"bench", "pipeline", "--rate", "300", "--peer", "."}, "the River build posts in a closed loop only"},
		{[]string{"bench", "pipeline", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"bench"}, "usage: assay-dev bench pipeline"},
		{[]string{"bench"}, "usage: assay-dev bench parts"},
		{[]string{"bench", "parts", "--part-units", "x"}, `invalid value "x" for flag -part-units`},
		{[]string{"bench", "parts", "/nonexistent.diff"}, "/nonexistent.diff"},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want 2 naming %q", c.args, code, stderr.String(), c.want)
		}
	}
}
