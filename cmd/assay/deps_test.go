package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOperatorToolLinksNoService: assay, the operator's tool (the
// container image's assay), links none of the services, nor an embedded
// nats-server or anything of the dev kit (the throwaway Postgres, the
// test environment, the fake GitHub, the simulated provider). assay-dev,
// which runs the cells in its process, links the services: the check
// tells the two apart.
func TestOperatorToolLinksNoService(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	var linked []string
	services := 0
	for _, p := range deps(".") {
		if strings.HasPrefix(p, "assay.dev/services/") || strings.HasPrefix(p, "github.com/nats-io/nats-server/") ||
			strings.HasPrefix(p, "assay.dev/pkg/devkit/") {
			linked = append(linked, p)
		}
	}
	if len(linked) > 0 {
		t.Errorf("assay links %v: a command that needs them belongs in assay-dev (./assay-dev)", linked)
	}
	for _, p := range deps("./assay-dev") {
		if strings.HasPrefix(p, "assay.dev/services/") {
			services++
		}
	}
	if services == 0 {
		t.Error("assay-dev links no service: this test no longer tells the binaries apart")
	}
}
