package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOperatorBuildLinksNoDevKit: the operator build (-tags operator, the
// container image's assay) links neither the dev kit (the simulated
// provider, the throwaway Postgres, the test environment) nor an embedded
// nats-server, while the development build links both.
func TestOperatorBuildLinksNoDevKit(t *testing.T) {
	deps := func(tags ...string) []string {
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, ".")...).Output()
		if err != nil {
			t.Fatalf("go %v: %v", args, err)
		}
		return strings.Fields(string(out))
	}
	dev := func(pkgs []string) (out []string) {
		for _, p := range pkgs {
			if strings.HasPrefix(p, "assay.dev/pkg/devkit") || strings.HasPrefix(p, "github.com/nats-io/nats-server") {
				out = append(out, p)
			}
		}
		return out
	}
	if got := dev(deps("-tags", "operator")); len(got) > 0 {
		t.Errorf("the operator build links %v", got)
	}
	if got := dev(deps()); len(got) == 0 {
		t.Error("the development build links no dev kit: this test no longer tells the builds apart")
	}
}
