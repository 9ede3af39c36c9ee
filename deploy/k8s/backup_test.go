package k8s

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The object store of every cell's backups, set in one place, and its
// example for an S3-compatible store other than AWS.
const (
	objectStoreFile  = "postgres/objectstore.yaml"
	objectStoreMinIO = "postgres/objectstore-minio.example.yaml"
)

// TestBackupStore: the backup store is set in one place,
// postgres/objectstore.yaml (bucket, endpoint, CA, credentials), and every
// cell's backups go to its destinationPath followed by /<cell>, with its
// endpoint and credentials; its MinIO example, copied over it as
// deploy/README.md says, gives every cell the same store at MinIO's
// endpoint with the CA; the two files differ in the endpoint's settings
// alone, so the example does not drift; every credential is a listed key
// of the Secret assay-pg-backup; deploy/README.md's section documents each
// setting and the copy.
func TestBackupStore(t *testing.T) {
	base := readObjectStore(t, objectStoreFile)
	minio := readObjectStore(t, objectStoreMinIO)
	if c := base.Spec.Configuration; c.EndpointURL != "" || c.EndpointCA != nil || strings.HasSuffix(c.DestinationPath, "/") {
		t.Errorf("%s: %+v: want AWS S3 by default (no endpoint) and the bucket without a trailing /", objectStoreFile, c)
	}
	if c := minio.Spec.Configuration; !strings.HasPrefix(c.EndpointURL, "http") || c.EndpointCA == nil {
		t.Errorf("%s: endpoint %q CA %+v: want MinIO's URL and the CA of its certificate", objectStoreMinIO, c.EndpointURL, c.EndpointCA)
	}
	same := *minio
	same.Spec.Configuration.EndpointURL, same.Spec.Configuration.EndpointCA = "", nil
	if a, b := mustJSON(t, base), mustJSON(t, &same); a != b {
		t.Errorf("%s differs from %s in more than the endpoint:\n%s\n%s", objectStoreMinIO, objectStoreFile, b, a)
	}
	for file, store := range map[string]*barmanObjectStoreCR{objectStoreFile: base, objectStoreMinIO: minio} {
		c := store.Spec.Configuration
		for what, ref := range map[string]*secretKeySelector{"endpointCA": c.EndpointCA, "accessKeyId": c.S3Credentials.AccessKeyID,
			"secretAccessKey": c.S3Credentials.SecretAccessKey} {
			if ref != nil && (ref.Name != "assay-pg-backup" || !slices.Contains(secrets[ref.Name], ref.Key)) {
				t.Errorf("%s: %s %+v is not a listed key of the Secret assay-pg-backup", file, what, ref)
			}
		}
	}
	for file, want := range map[string]*barmanObjectStoreCR{objectStoreFile: base, objectStoreMinIO: minio} {
		mem := memTree(t)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := mem.WriteFile("/k8s/"+objectStoreFile, b); err != nil {
			t.Fatal(err)
		}
		for _, cell := range cellIDs {
			if singleNode[cell] {
				continue // no backups on one node
			}
			got := renderObjectStore(t, mem, "/k8s/"+cellDir(cell))
			w := want.Spec.Configuration
			g := got.Spec.Configuration
			if g.DestinationPath != w.DestinationPath+"/"+cell || g.EndpointURL != w.EndpointURL || mustJSON(t, g.EndpointCA) != mustJSON(t, w.EndpointCA) ||
				mustJSON(t, g.S3Credentials) != mustJSON(t, w.S3Credentials) {
				t.Errorf("%s with %s: the cell's store %+v, want %s/%s at %q with %s's credentials", cell, file, g, w.DestinationPath, cell, w.EndpointURL, file)
			}
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(readme), "### Backups: where they go")
	if start < 0 {
		t.Fatal("deploy/README.md has no section \"Backups: where they go\"")
	}
	section := string(readme[start:])
	section = section[:strings.Index(section[1:], "\n#")+1]
	for _, want := range []string{"deploy/k8s/" + objectStoreFile, "cp deploy/k8s/" + objectStoreMinIO + " deploy/k8s/" + objectStoreFile,
		"`destinationPath`", "`endpointURL`", "`endpointCA`", "`s3Credentials`", "`assay-pg-backup`", "`ACCESS_KEY_ID`", "`ACCESS_SECRET_KEY`", "`ca.crt`"} {
		if !strings.Contains(section, want) {
			t.Errorf("deploy/README.md's section on backups does not say %s", want)
		}
	}
}

func readObjectStore(t *testing.T, file string) *barmanObjectStoreCR {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	o := new(barmanObjectStoreCR)
	if err := yamlStrict(b, o); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if o.Name != "assay-pg-backup" || o.Kind != "ObjectStore" {
		t.Fatalf("%s: %s %s, want the ObjectStore assay-pg-backup", file, o.Kind, o.Name)
	}
	return o
}

// renderObjectStore is the one ObjectStore the kustomization in dir of fs
// renders, decoded strictly.
func renderObjectStore(t *testing.T, fs filesys.FileSystem, dir string) *barmanObjectStoreCR {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	stores := map[string]*barmanObjectStoreCR{}
	for _, o := range objects(t, m) {
		if o.Kind == "ObjectStore" {
			if err := into(o, stores); err != nil {
				t.Fatalf("%s: ObjectStore %s: %v", dir, o.Name, err)
			}
		}
	}
	if len(stores) != 1 || stores["assay-pg-backup"] == nil {
		t.Fatalf("%s: ObjectStores %v, want assay-pg-backup", dir, keys(stores))
	}
	return stores["assay-pg-backup"]
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
