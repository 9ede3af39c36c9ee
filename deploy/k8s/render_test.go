package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// cells are the region cells with an overlay each.
var cells = []string{"us", "eu"}

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
