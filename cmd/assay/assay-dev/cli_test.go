package main

import (
	"bytes"
	"strings"
	"testing"
)

// A mistyped command or bench exits 2 and says what was wrong; help is
// printed for what exists, and the operator's commands are named as
// assay's.
func TestCommandMistakesAreNamed(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "usage: assay-dev <command>"},
		{[]string{"bench", "bogus"}, `unknown bench command "bogus" (it takes goodput, pipeline, parts, cells, move)`},
		{[]string{"bench", "bogus", "--help"}, `unknown bench command "bogus"`},
		{[]string{"devs"}, "did you mean assay-dev dev?"},
		{[]string{"migrate"}, "commands are in assay (bin/assay)"},
		{[]string{"dev", "--port", "0"}, "--port: 0 is not a port"},
		{[]string{"sim", "--addr", "nowhere"}, "ASSAY_HTTP_ADDR"},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("assay-dev %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), code, stderr.String(), c.want)
		}
	}
	for _, args := range [][]string{{"help"}, {"dev", "--help"}, {"dev", "webhook", "-h"}, {"bench", "move", "--help"}} {
		var stderr bytes.Buffer
		if code := run(args, &stderr); code != 0 {
			t.Errorf("assay-dev %s: exit %d (%s), want its help and 0", strings.Join(args, " "), code, stderr.String())
		}
	}
}
