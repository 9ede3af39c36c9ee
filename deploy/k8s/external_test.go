package k8s

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
)

// TestExternalPostgres follows deploy/README.md's "An external managed
// Postgres instead" on a copy of the tree: the us overlay without
// ../../postgres and without the replacement that places its backups
// still renders, has no
// CloudNativePG object, and its services still read the Secret
// assay-pg-app, which is then yours to make.
func TestExternalPostgres(t *testing.T) {
	mem := memTree(t)
	k, err := mem.ReadFile("/k8s/overlays/us/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := string(k)
	cut := strings.Index(s, "replacements:")
	if cut < 0 || !strings.Contains(s, "  - ../../postgres\n") {
		t.Fatalf("overlays/us/kustomization.yaml is not laid out as deploy/README.md describes:\n%s", s)
	}
	s = strings.Replace(s[:cut], "  - ../../postgres\n", "", 1)
	if err := mem.WriteFile("/k8s/overlays/us/kustomization.yaml", []byte(s)); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/k8s/overlays/us")
	if err != nil {
		t.Fatalf("the overlay without its Postgres: %v", err)
	}
	reads := 0
	for _, o := range objects(t, m) {
		if strings.HasPrefix(o.APIVersion, "postgresql.cnpg.io/") {
			t.Errorf("%s %s is still rendered", o.Kind, o.Name)
		}
		if o.Kind == "Deployment" && strings.Contains(string(o.JSON), `"secretKeyRef":{"key":"uri","name":"assay-pg-app"}`) {
			reads++
		}
	}
	if reads != len(services) {
		t.Errorf("%d of %d services read ASSAY_DATABASE_URL from assay-pg-app", reads, len(services))
	}
}
