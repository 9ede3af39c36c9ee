package k8s

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// natsChartVersion is the NATS Helm chart these values were read from and
// that deploy/README.md installs (--version).
const natsChartVersion = "2.14.2"

// natsHelmValues are the fields of the NATS Helm chart's values
// (github.com/nats-io/k8s, helm/charts/nats/values.yaml at nats-2.14.2)
// that deploy/k8s/nats sets. Decoding strictly into them fails on a key the
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
		Env   map[string]string `json:"env"`
		Merge struct {
			EnvFrom []struct {
				SecretRef struct {
					Name string `json:"name"`
				} `json:"secretRef"`
			} `json:"envFrom"`
			SecurityContext *corev1.SecurityContext `json:"securityContext"`
		} `json:"merge"`
		Patch     []jsonPatchOp               `json:"patch"`
		Resources corev1.ResourceRequirements `json:"resources"`
	} `json:"container"`
	Reloader struct {
		Merge struct {
			SecurityContext *corev1.SecurityContext `json:"securityContext"`
		} `json:"merge"`
	} `json:"reloader"`
	PromExporter struct {
		Enabled bool `json:"enabled"`
		Port    int  `json:"port"`
		Merge   struct {
			SecurityContext *corev1.SecurityContext `json:"securityContext"`
		} `json:"merge"`
	} `json:"promExporter"`
	PodTemplate struct {
		Merge struct {
			Spec struct {
				SecurityContext *corev1.PodSecurityContext `json:"securityContext"`
			} `json:"spec"`
		} `json:"merge"`
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

// TestNATSValues: each region's NATS is a three-node cluster with JetStream
// on file storage, TLS on clients and routes, the servers tagged with what
// the streams of the region's cells are placed by, and the accounts file
// of each of its NATS kustomizations mounted where the include names it,
// with the passwords from a Secret.
func TestNATSValues(t *testing.T) {
	for _, cell := range regions {
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
		for id, region := range cells {
			if region != cell {
				continue
			}
			placement := strings.Split(cellConfig(t, load(t, cellDir(id))).Data["stream-placement"], ",")
			for _, tag := range placement {
				if !slices.Contains(c.Merge.ServerTags, tag) {
					t.Errorf("%s: cell %s's streams are placed by %q, which the servers' tags %v lack", cell, id, tag, c.Merge.ServerTags)
				}
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
		for _, k := range natsKustomizations {
			if k.region != cell {
				continue
			}
			if cm := load(t, k.dir).configMaps[vol.ConfigMap.Name]; cm == nil || cm.Data["assay.conf"] == "" {
				t.Errorf("%s: the volume's ConfigMap %q is not rendered by %s with assay.conf", cell, vol.ConfigMap.Name, k.dir)
			}
		}
		if len(v.PodTemplate.TopologySpreadConstraints["kubernetes.io/hostname"].WhenUnsatisfiable) == 0 {
			t.Errorf("%s: the servers are not spread over nodes", cell)
		}
		checkNATSRuntime(t, cell, v)
	}
}

// TestNATSAccountsAreGenerated: each NATS kustomization's accounts file is
// what assay nats-config writes for its cells, so it names the same users,
// subjects and JetStream calls as the code (deploy/nats/README.md).
func TestNATSAccountsAreGenerated(t *testing.T) {
	for _, k := range natsKustomizations {
		flag := cellsFlag(k.cells)
		want, err := exec.Command(binary(t, "assay"), "nats-config", "--cells", flag).Output()
		if err != nil {
			t.Fatalf("assay nats-config --cells %s: %v", flag, err)
		}
		got, err := os.ReadFile(k.dir + "/assay.conf")
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s/assay.conf differs from assay nats-config --cells %s; run it again:\n  (cd cmd/assay && go run . nats-config --cells %s) > deploy/k8s/%s/assay.conf", k.dir, flag, flag, k.dir)
		}
	}
}

// checkNATSRuntime: the server, its config reloader and its exporter run
// non-root with nothing to escalate to and a read-only root; the server's
// Go runtime collects before its memory limit; the exporter is on.
func checkNATSRuntime(t *testing.T, cell string, v *natsHelmValues) {
	t.Helper()
	ps := v.PodTemplate.Merge.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 || ps.FSGroup == nil ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the NATS pod's securityContext %+v: want non-root, an fsGroup for the volume, RuntimeDefault seccomp", cell, ps)
	}
	for what, cs := range map[string]*corev1.SecurityContext{"nats": v.Container.Merge.SecurityContext,
		"reloader": v.Reloader.Merge.SecurityContext, "exporter": v.PromExporter.Merge.SecurityContext} {
		if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil ||
			!*cs.ReadOnlyRootFilesystem || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: the %s container's securityContext %+v", cell, what, cs)
		}
	}
	limit := v.Container.Resources.Limits.Memory().Value()
	gml, err := goMemLimit(v.Container.Env["GOMEMLIMIT"])
	if err != nil || limit == 0 || float64(gml) < 0.8*float64(limit) || float64(gml) > 0.95*float64(limit) {
		t.Errorf("%s: NATS GOMEMLIMIT %q is not 80–95 %% of its memory limit %d", cell, v.Container.Env["GOMEMLIMIT"], limit)
	}
	if !v.PromExporter.Enabled || v.PromExporter.Port != 7777 {
		t.Errorf("%s: the NATS exporter %+v: want it on 7777, where its policy and PodMonitor look", cell, v.PromExporter)
	}
}

// TestNATSChartVersionPinned: every helm command deploy/README.md gives
// installs or upgrades the chart at the version the values were read from.
func TestNATSChartVersionPinned(t *testing.T) {
	for _, f := range []string{"../README.md", "nats/values.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "helm install") || strings.Contains(line, "helm upgrade") {
				n++
				if !strings.Contains(line, "nats/nats --version "+natsChartVersion+" ") {
					t.Errorf("%s: %q does not pin the chart at --version %s", f, strings.TrimSpace(line), natsChartVersion)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no helm command", f)
		}
	}
}
