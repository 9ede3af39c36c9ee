package k8s

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// natsHelmValues are the fields of the NATS Helm chart's values
// (github.com/nats-io/k8s, helm/charts/nats/values.yaml) that
// deploy/k8s/nats sets. Decoding strictly into them fails on a key the
// chart does not have at that place, or one added here without its check.
type natsHelmValues struct {
	TLSCA struct {
		Enabled    bool   `json:"enabled"`
		SecretName string `json:"secretName"`
		Key        string `json:"key"`
	} `json:"tlsCA"`
	Config struct {
		Cluster struct {
			Enabled  bool        `json:"enabled"`
			Replicas int         `json:"replicas"`
			TLS      natsHelmTLS `json:"tls"`
			Merge    struct {
				Name string `json:"name"`
			} `json:"merge"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				PVC     struct {
					Enabled bool   `json:"enabled"`
					Size    string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool `json:"enabled"`
			} `json:"memoryStore"`
		} `json:"jetstream"`
		NATS struct {
			TLS natsHelmTLS `json:"tls"`
		} `json:"nats"`
		Monitor struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		Merge struct {
			Include    string   `json:"$include"`
			ServerTags []string `json:"server_tags"`
		} `json:"merge"`
	} `json:"config"`
	Container struct {
		Merge struct {
			EnvFrom []struct {
				SecretRef struct {
					Name string `json:"name"`
				} `json:"secretRef"`
			} `json:"envFrom"`
		} `json:"merge"`
		Patch     []jsonPatchOp  `json:"patch"`
		Resources map[string]any `json:"resources"`
	} `json:"container"`
	PodTemplate struct {
		TopologySpreadConstraints map[string]struct {
			MaxSkew           int    `json:"maxSkew"`
			WhenUnsatisfiable string `json:"whenUnsatisfiable"`
		} `json:"topologySpreadConstraints"`
		Patch []jsonPatchOp `json:"patch"`
	} `json:"podTemplate"`
	PodDisruptionBudget struct {
		Enabled bool `json:"enabled"`
	} `json:"podDisruptionBudget"`
	NatsBox struct {
		Enabled bool `json:"enabled"`
	} `json:"natsBox"`
}

// accountsVolume is the volume the values add to the pod and mount in the
// nats container.
func (v *natsHelmValues) accountsVolume() (mount struct{ Name, MountPath string }, vol struct {
	Name      string
	ConfigMap struct{ Name string }
}) {
	for _, p := range v.Container.Patch {
		if p.Op == "add" && p.Path == "/volumeMounts/-" {
			json.Unmarshal(p.Value, &mount)
		}
	}
	for _, p := range v.PodTemplate.Patch {
		if p.Op == "add" && p.Path == "/spec/volumes/-" {
			json.Unmarshal(p.Value, &vol)
		}
	}
	return mount, vol
}

type natsHelmTLS struct {
	Enabled    bool   `json:"enabled"`
	SecretName string `json:"secretName"`
	Merge      struct {
		Verify bool `json:"verify"`
	} `json:"merge"`
}

type jsonPatchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value"`
}

// natsValues are the cell's Helm values as helm install -f values.yaml -f
// values-<cell>.yaml merges them (maps merged key by key, the later file
// winning), decoded strictly.
func natsValues(t *testing.T, cell string) *natsHelmValues {
	t.Helper()
	merged := map[string]any{}
	for _, f := range []string{"nats/values.yaml", "nats/values-" + cell + ".yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		mergeValues(merged, m)
	}
	b, err := json.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	v := new(natsHelmValues)
	if err := strict(b, v); err != nil {
		t.Fatalf("nats values for %s: %v", cell, err)
	}
	return v
}

func mergeValues(dst, src map[string]any) {
	for k, sv := range src {
		if sm, ok := sv.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = sv
	}
}

// TestNATSValues: each cell's NATS is a three-node cluster with JetStream on
// file storage, TLS on clients and routes, the servers tagged with what the
// cell's streams are placed by, and the cell's accounts file mounted where
// the include names it, with the passwords from a Secret.
func TestNATSValues(t *testing.T) {
	for _, cell := range cells {
		v := natsValues(t, cell)
		c := v.Config
		if !c.Cluster.Enabled || c.Cluster.Replicas != 3 || c.Cluster.Merge.Name != "assay-"+cell {
			t.Errorf("%s: cluster %+v: want three servers in cluster assay-%s", cell, c.Cluster, cell)
		}
		if !c.JetStream.Enabled || !c.JetStream.FileStore.Enabled || !c.JetStream.FileStore.PVC.Enabled || c.JetStream.MemoryStore.Enabled {
			t.Errorf("%s: JetStream %+v: want file storage on a volume, no memory store", cell, c.JetStream)
		}
		for what, tls := range map[string]natsHelmTLS{"client": c.NATS.TLS, "cluster": c.Cluster.TLS} {
			if !tls.Enabled || !slices.Contains(keys(secrets), tls.SecretName) {
				t.Errorf("%s: %s TLS %+v: want it on, from a listed Secret", cell, what, tls)
			}
		}
		if !v.TLSCA.Enabled || v.TLSCA.SecretName != "nats-ca" || !slices.Contains(secrets["nats-ca"], v.TLSCA.Key) {
			t.Errorf("%s: tlsCA %+v: want the Secret nats-ca the services trust", cell, v.TLSCA)
		}
		if !c.Monitor.Enabled || c.Monitor.Port != 8222 {
			t.Errorf("%s: monitoring %+v: KEDA reads port 8222", cell, c.Monitor)
		}
		placement := strings.Split(cellConfig(t, load(t, cellDir(cell))).Data["stream-placement"], ",")
		for _, tag := range placement {
			if !slices.Contains(c.Merge.ServerTags, tag) {
				t.Errorf("%s: the streams are placed by %q, which the servers' tags %v lack", cell, tag, c.Merge.ServerTags)
			}
		}
		if len(v.Container.Merge.EnvFrom) != 1 || v.Container.Merge.EnvFrom[0].SecretRef.Name != "assay-nats-passwords" {
			t.Errorf("%s: the servers' environment does not come from assay-nats-passwords", cell)
		}
		// The include is relative to /etc/nats-config/nats.conf; the volume
		// mounted there holds the ConfigMap nats/<cell> renders.
		mount, vol := v.accountsVolume()
		if mount.Name == "" || mount.Name != vol.Name || filepath.Join("/etc/nats-config", c.Merge.Include) != filepath.Join(mount.MountPath, "assay.conf") {
			t.Errorf("%s: include %q is not the mounted accounts file (%+v, %+v)", cell, c.Merge.Include, mount, vol)
		}
		if cm := load(t, "nats/"+cell).configMaps[vol.ConfigMap.Name]; cm == nil || cm.Data["assay.conf"] == "" {
			t.Errorf("%s: the volume's ConfigMap %q is not rendered by nats/%s with assay.conf", cell, vol.ConfigMap.Name, cell)
		}
		if len(v.PodTemplate.TopologySpreadConstraints["kubernetes.io/hostname"].WhenUnsatisfiable) == 0 {
			t.Errorf("%s: the servers are not spread over nodes", cell)
		}
	}
}

// TestNATSAccountsAreGenerated: each cell's accounts file is what assay
// nats-config writes for that cell alone, so it names the same users,
// subjects and JetStream calls as the code (deploy/nats/README.md).
func TestNATSAccountsAreGenerated(t *testing.T) {
	for _, cell := range cells {
		want, err := exec.Command(binary(t, "assay"), "nats-config", "--cells", cell).Output()
		if err != nil {
			t.Fatalf("assay nats-config --cells %s: %v", cell, err)
		}
		got, err := os.ReadFile("nats/" + cell + "/assay.conf")
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("nats/%s/assay.conf differs from assay nats-config --cells %s; run it again:\n  (cd cmd/assay && go run . nats-config --cells %s) > deploy/k8s/nats/%s/assay.conf", cell, cell, cell, cell)
		}
	}
}
