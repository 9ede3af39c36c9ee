package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// cells are the cells with an overlay each (overlays/<cell>), by region:
// a region's first cell has the region's id, us-2 is the us region's
// second, and trial is the cell of a one-node trial (singleNode), a region
// of its own.
var cells = map[string]string{"us": "us", "eu": "eu", "us-2": "us", "trial": "trial"}

// cellIDs are the cells in a fixed order.
var cellIDs = []string{"us", "eu", "us-2", "trial"}

// regions are the regions, each with its NATS Helm values
// (nats/values-<region>.yaml) and its NATS kustomization (nats/<region>).
var regions = []string{"us", "eu"}

// natsKustomizations are the NATS kustomizations and the cells whose
// accounts their accounts file holds: a region's own for its first cell,
// and us-with-us-2 for the us region run as two cells.
var natsKustomizations = []natsKustomization{
	{"nats/us", "us", []string{"us"}},
	{"nats/eu", "eu", []string{"eu"}},
	{"nats/us-with-us-2", "us", []string{"us", "us-2"}},
}

type natsKustomization struct {
	dir, region string
	cells       []string
}

// natsDirs are the NATS kustomizations that serve cell, the first being
// the one a region of that cell's kind installs.
func natsDirs(cell string) []string {
	var out []string
	for _, k := range natsKustomizations {
		if slices.Contains(k.cells, cell) {
			out = append(out, k.dir)
		}
	}
	return out
}

// cellsFlag is the --cells of assay nats-config for cells: a cell outside
// the region its id names is written cell:region.
func cellsFlag(ids []string) string {
	var out []string
	for _, c := range ids {
		if cells[c] != c {
			c += ":" + cells[c]
		}
		out = append(out, c)
	}
	return strings.Join(out, ",")
}

// object is one rendered manifest: its kind, name and JSON.
type object struct {
	APIVersion, Kind, Name string
	JSON                   []byte
}

// render builds the kustomization in dir (relative to this module) the way
// kubectl apply -k does, with the default options (load restrictions on).
func render(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Clean(dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return objects(t, m)
}

func objects(t *testing.T, m resmap.ResMap) []object {
	t.Helper()
	var out []object
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		out = append(out, object{APIVersion: r.GetApiVersion(), Kind: r.GetKind(), Name: r.GetName(), JSON: b})
	}
	return out
}

// strict decodes b into v, refusing fields v does not have and trailing data.
func strict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}
