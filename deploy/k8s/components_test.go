package k8s

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cmv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// memTree is a copy of this module's manifests in memory, under /k8s, for
// a test that edits a kustomization the way deploy/README.md tells an
// operator to.
func memTree(t *testing.T) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".conf")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return mem.WriteFile(filepath.Join("/k8s", path), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// edit replaces old by new, once, in a file of the tree.
func edit(t *testing.T, mem filesys.FileSystem, path, old, new string) {
	t.Helper()
	b, err := mem.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s is not laid out as deploy/README.md describes (no %q):\n%s", path, old, b)
	}
	if err := mem.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1))); err != nil {
		t.Fatal(err)
	}
}

// withComponents is what a cell renders with the optional components: the
// overlay with monitoring and both API examples, the NATS kustomization
// with cert-manager.
type withComponents struct {
	monitors     map[string]*monv1.ServiceMonitor
	podMonitors  map[string]*monv1.PodMonitor
	rules        map[string]*monv1.PrometheusRule
	certificates map[string]*cmv1.Certificate
	issuers      map[string]*cmv1.Issuer
	ingresses    map[string]*networkingv1.Ingress
	routes       map[string]*gwv1.HTTPRoute
	services     map[string]*corev1.Service
	rest         []object
}

func renderWithComponents(t *testing.T, cell string) *withComponents {
	t.Helper()
	mem := memTree(t)
	edit(t, mem, "/k8s/overlays/"+cell+"/kustomization.yaml", "components:\n  - cell\n",
		"components:\n  - cell\n  - ../../components/monitoring\n  - ../../components/api-ingress\n  - ../../components/api-httproute\n")
	dirs := []string{"/k8s/overlays/" + cell}
	// The certificates are the region's NATS's, made where its release is
	// (a cell on one node has no TLS, and its NATS server is its own).
	if !singleNode[cell] {
		region := "/k8s/nats/" + cells[cell]
		b, _ := mem.ReadFile(region + "/kustomization.yaml")
		if err := mem.WriteFile(region+"/kustomization.yaml", append(b, []byte("components:\n  - ../../components/cert-manager\n")...)); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, "/k8s/"+natsDirs(cell)[0])
	}
	w := &withComponents{monitors: map[string]*monv1.ServiceMonitor{}, podMonitors: map[string]*monv1.PodMonitor{},
		rules: map[string]*monv1.PrometheusRule{}, certificates: map[string]*cmv1.Certificate{}, issuers: map[string]*cmv1.Issuer{},
		ingresses: map[string]*networkingv1.Ingress{}, routes: map[string]*gwv1.HTTPRoute{}, services: map[string]*corev1.Service{}}
	for _, dir := range dirs {
		m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
		if err != nil {
			t.Fatalf("%s with the components: %v", dir, err)
		}
		for _, o := range objects(t, m) {
			var err error
			switch o.APIVersion + " " + o.Kind {
			case "monitoring.coreos.com/v1 ServiceMonitor":
				err = into(o, w.monitors)
			case "monitoring.coreos.com/v1 PodMonitor":
				err = into(o, w.podMonitors)
			case "monitoring.coreos.com/v1 PrometheusRule":
				err = into(o, w.rules)
			case "cert-manager.io/v1 Certificate":
				err = into(o, w.certificates)
			case "cert-manager.io/v1 Issuer":
				err = into(o, w.issuers)
			case "networking.k8s.io/v1 Ingress":
				err = into(o, w.ingresses)
			case "gateway.networking.k8s.io/v1 HTTPRoute":
				err = into(o, w.routes)
			case "v1 Service":
				err = into(o, w.services)
			default:
				w.rest = append(w.rest, o)
			}
			if err != nil {
				t.Errorf("%s: %s %s/%s: %v", dir, o.APIVersion, o.Kind, o.Name, err)
			}
		}
	}
	return w
}

// TestOptionalComponents renders each cell with the optional components
// and decodes every object strictly into its upstream type
// (prometheus-operator, cert-manager, Gateway API, k8s.io/api), then
// checks that each selects or names what the cell has.
func TestOptionalComponents(t *testing.T) {
	for _, cell := range cellIDs {
		t.Run(cell, func(t *testing.T) {
			w := renderWithComponents(t, cell)
			checkMonitors(t, w)
			if !singleNode[cell] {
				checkCertificates(t, w, cells[cell])
			}
			checkAPIExamples(t, w)
		})
	}
}

func checkMonitors(t *testing.T, w *withComponents) {
	t.Helper()
	sm := w.monitors["assay"]
	if sm == nil || len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitors %v: want assay with one endpoint", keys(w.monitors))
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var selected []string
	for name, svc := range w.services {
		if sel.Matches(labels.Set(svc.Labels)) {
			selected = append(selected, name)
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port }) {
				t.Errorf("Service %s has no port %q to scrape", name, sm.Spec.Endpoints[0].Port)
			}
		}
	}
	if slices.Sort(selected); !slices.Equal(selected, sorted(services)) {
		t.Errorf("the ServiceMonitor selects the Services %v, want %v", selected, sorted(services))
	}
	if e := sm.Spec.Endpoints[0]; !e.HonorLabels || e.Port != "metrics" {
		t.Errorf("the ServiceMonitor's endpoint %+v: want the metrics port with the services' own labels kept", e)
	}
	// The NATS exporter's container port, as the chart names it, and the
	// CloudNativePG instances'.
	for name, want := range map[string]struct {
		pod  map[string]string
		port string
	}{
		"nats":     {map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"}, "prom-metrics"},
		"assay-pg": {map[string]string{"cnpg.io/cluster": "assay-pg", "cnpg.io/podRole": "instance", "cnpg.io/instanceRole": "primary"}, "metrics"},
	} {
		pm := w.podMonitors[name]
		if pm == nil {
			t.Errorf("no PodMonitor %s", name)
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(want.pod)) || len(pm.Spec.PodMetricsEndpoints) != 1 ||
			pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != want.port {
			t.Errorf("PodMonitor %s does not scrape port %s of %v", name, want.port, want.pod)
		}
	}
	if w.rules["assay-platform"] == nil {
		t.Errorf("no PrometheusRule assay-platform")
	}
}

func checkCertificates(t *testing.T, w *withComponents, region string) {
	t.Helper()
	ns := "assay-" + region
	values := natsValues(t, region)
	ca := w.certificates["nats-ca"]
	if ca == nil || !ca.Spec.IsCA || ca.Spec.SecretName != values.TLSCA.SecretName || values.TLSCA.Key != "ca.crt" {
		t.Fatalf("the CA certificate %+v: want an isCA certificate into %s (ca.crt)", ca, values.TLSCA.SecretName)
	}
	if is := w.issuers["nats-ca"]; is == nil || is.Spec.CA == nil || is.Spec.CA.SecretName != ca.Spec.SecretName {
		t.Errorf("no CA Issuer signing with %s", ca.Spec.SecretName)
	}
	for secret, want := range map[string][]string{
		values.Config.NATS.TLS.SecretName:    {"nats", "nats." + ns + ".svc", "nats." + ns + ".svc.cluster.local", "*.nats-headless." + ns + ".svc.cluster.local"},
		values.Config.Cluster.TLS.SecretName: {"*.nats-headless." + ns + ".svc.cluster.local"},
	} {
		var c *cmv1.Certificate
		for _, x := range w.certificates {
			if x.Spec.SecretName == secret {
				c = x
			}
		}
		if c == nil {
			t.Errorf("no Certificate writes the Secret %s the NATS values read", secret)
			continue
		}
		if !slices.Equal(c.Spec.DNSNames, want) || c.Spec.IssuerRef.Name != "nats-ca" {
			t.Errorf("Certificate %s: names %v issued by %q, want %v by nats-ca", c.Name, c.Spec.DNSNames, c.Spec.IssuerRef.Name, want)
		}
		clientAuth := slices.Contains(c.Spec.Usages, cmv1.UsageClientAuth)
		if routes := secret == values.Config.Cluster.TLS.SecretName; routes != clientAuth || !slices.Contains(c.Spec.Usages, cmv1.UsageServerAuth) {
			t.Errorf("Certificate %s: usages %v (routes verify each other: client auth there only)", c.Name, c.Spec.Usages)
		}
	}
}

func checkAPIExamples(t *testing.T, w *withComponents) {
	t.Helper()
	svc := w.services["ingress"]
	port := func(name string) int32 {
		for _, p := range svc.Spec.Ports {
			if p.Name == name {
				return p.Port
			}
		}
		return 0
	}
	ing := w.ingresses["assay-api"]
	if ing == nil || len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].HTTP == nil {
		t.Fatalf("Ingress assay-api: %+v", ing)
	}
	for _, p := range ing.Spec.Rules[0].HTTP.Paths {
		if b := p.Backend.Service; b == nil || b.Name != "ingress" || b.Port.Name != "http" || port("http") == 0 {
			t.Errorf("Ingress path %s goes to %+v, not ingress's http port", p.Path, p.Backend)
		}
	}
	rt := w.routes["assay-api"]
	if rt == nil || len(rt.Spec.Rules) != 1 {
		t.Fatalf("HTTPRoute assay-api: %+v", rt)
	}
	for _, b := range rt.Spec.Rules[0].BackendRefs {
		if string(b.Name) != "ingress" || b.Port == nil || int32(*b.Port) != port("http") {
			t.Errorf("HTTPRoute backend %s:%v is not ingress's http port %d", b.Name, b.Port, port("http"))
		}
	}
}

// TestPlatformRules runs promtool over the platform PrometheusRule's spec:
// it loads, every alert has a unit test, a for:, a severity and a section
// in deploy/prometheus/RUNBOOK.md.
func TestPlatformRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: the rule tests need Debian's prometheus package (apt-get install prometheus)")
	}
	raw, err := os.ReadFile("components/monitoring/platform-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr monv1.PrometheusRule
	if err := yamlStrict(raw, &pr); err != nil {
		t.Fatal(err)
	}
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests, err := os.ReadFile("components/monitoring/platform-rules.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"platform.rules.yml": spec, "platform-rules.test.yml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"check", "rules", "platform.rules.yml"}, {"test", "rules", "platform-rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	runbook, err := os.ReadFile("../prometheus/RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
				t.Errorf("alert %s has no unit test", r.Alert)
			}
			if r.For == nil || r.Labels["severity"] == "" || r.Annotations["runbook"] != "deploy/prometheus/RUNBOOK.md#"+strings.ToLower(r.Alert) ||
				!strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("alert %s: want for:, a severity and its RUNBOOK.md section", r.Alert)
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d platform alerts, want the NATS volume, route and meta-leader ones and Postgres's lag and WAL archiving", alerts)
	}
}

// yamlStrict decodes YAML into v, refusing fields v does not have.
func yamlStrict(b []byte, v any) error {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return err
	}
	return strict(j, v)
}
