package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// singleNode are the cells made for a cluster of one node (overlays/trial):
// their own Postgres instance and NATS server (postgres/single,
// nats/single), no operator, no KEDA, and their migration Job in the
// overlay itself.
var singleNode = map[string]bool{"trial": true}

// builtinAPIs are the API versions every Kubernetes cluster serves: a cell
// on one node uses no other, so it applies with no operator and no CRD.
var builtinAPIs = map[string]bool{"v1": true, "apps/v1": true, "batch/v1": true, "policy/v1": true, "networking.k8s.io/v1": true}

// checkSingleNode: the cell applies to a one-node cluster with nothing
// installed (only built-in kinds); nothing in it asks for a second node
// (no hard spread, no required anti-affinity, no node selection), its
// PodDisruptionBudgets let a drain of the one node evict every pod, and
// every Deployment sets its own replicas. Its Postgres is one instance on a
// volume of the default class, with the password the listed Secret holds
// and room for every pod's pool; its NATS server runs JetStream on its
// volume, on the port its Service and the services' ASSAY_NATS_URL name.
func checkSingleNode(t *testing.T, s, m *set) {
	t.Helper()
	for _, o := range render(t, s.dir) {
		if !builtinAPIs[o.APIVersion] {
			t.Errorf("%s: %s %s/%s: not a built-in kind, so it needs something installed first", s.dir, o.APIVersion, o.Kind, o.Name)
		}
	}
	if len(s.clusters)+len(s.backups)+len(s.objectStores)+len(s.scaledObject) > 0 {
		t.Errorf("%s: renders CloudNativePG or KEDA objects", s.dir)
	}
	if len(m.jobs) != 1 || m.jobs["assay-migrate"] == nil {
		t.Errorf("%s: the migration Job is not in the overlay", s.dir)
	}
	templates := map[string]*corev1.PodTemplateSpec{}
	for n, p := range podSpecs(s) {
		templates[n] = p
	}
	for n, ss := range s.statefulSets {
		templates["StatefulSet/"+n] = &ss.Spec.Template
	}
	for n, p := range templates {
		checkOneNode(t, s.dir+": "+n, &p.Spec)
	}
	for name, d := range s.deployments {
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
			t.Errorf("%s: Deployment %s sets no replicas: nothing else (no KEDA) would", s.dir, name)
		}
	}
	// A drain of the one node evicts every pod there; a budget that allows
	// fewer disruptions than the pods it guards blocks it for good, since
	// their replacements cannot be scheduled on the cordoned node.
	for name, pdb := range s.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range selected(sel, s) {
			pods := int(*s.deployments[w].Spec.Replicas)
			if allowed := disruptionsAllowed(t, pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable, pods); allowed < pods {
				t.Errorf("%s: PodDisruptionBudget %s lets %d of %s's %d pods go at once: it blocks a drain of the one node", s.dir, name, allowed, w, pods)
			}
		}
	}
	for name, ss := range s.statefulSets {
		checkSingleNodeStatefulSet(t, s, name, ss)
	}
	checkSingleNodePostgres(t, s)
	checkSingleNodeNATS(t, s)
	checkProviderBudget(t, s, s.deployments["classifier"].Annotations)
	checkSurge(t, s)
}

// disruptionsAllowed is how many of pods a PodDisruptionBudget lets go at
// once, all of them healthy.
func disruptionsAllowed(t *testing.T, minAvailable, maxUnavailable *intstr.IntOrString, pods int) int {
	t.Helper()
	switch {
	case maxUnavailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(maxUnavailable, pods, true)
		if err != nil {
			t.Fatal(err)
		}
		return min(n, pods)
	case minAvailable != nil:
		n, err := intstr.GetScaledValueFromIntOrPercent(minAvailable, pods, true)
		if err != nil {
			t.Fatal(err)
		}
		return max(pods-n, 0)
	}
	return pods
}

// checkOneNode: a pod of p schedules on a cluster of one node, and keeps
// scheduling when it is drained and uncordoned: every spread is a
// preference, no anti-affinity is required, no node label is asked for.
func checkOneNode(t *testing.T, where string, p *corev1.PodSpec) {
	t.Helper()
	for _, c := range p.TopologySpreadConstraints {
		if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("%s: spread over %s is %s: one node cannot satisfy it", where, c.TopologyKey, c.WhenUnsatisfiable)
		}
	}
	if a := p.Affinity; a != nil {
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			t.Errorf("%s: a required pod anti-affinity: one node cannot satisfy it", where)
		}
		if a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			t.Errorf("%s: a required node affinity", where)
		}
	}
	if len(p.NodeSelector) > 0 {
		t.Errorf("%s: a node selector %v", where, p.NodeSelector)
	}
}

// checkSingleNodeStatefulSet: the trial's own Postgres and NATS run one
// pod, with a volume of the cluster's default class, as the restricted Pod
// Security Standard asks (the namespace warns on anything less), without
// a Kubernetes API token.
func checkSingleNodeStatefulSet(t *testing.T, s *set, name string, ss *appsv1.StatefulSet) {
	t.Helper()
	where := s.dir + ": StatefulSet " + name
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 {
		t.Errorf("%s: want one replica", where)
	}
	if len(ss.Spec.VolumeClaimTemplates) != 1 || ss.Spec.VolumeClaimTemplates[0].Spec.StorageClassName != nil ||
		ss.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().IsZero() {
		t.Errorf("%s: want one volume claim of the default StorageClass, with a size", where)
	}
	if svc := s.services[ss.Spec.ServiceName]; svc == nil {
		t.Errorf("%s: serviceName %q is not rendered", where, ss.Spec.ServiceName)
	}
	p := ss.Spec.Template.Spec
	if a := p.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("%s: the API token is mounted", where)
	}
	ps := p.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 || ps.FSGroup == nil ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod's securityContext %+v: want non-root, an fsGroup for the volume, RuntimeDefault seccomp", where, ps)
	}
	for _, c := range p.Containers {
		cs := c.SecurityContext
		if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil ||
			!*cs.ReadOnlyRootFilesystem || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s: container %s: securityContext %+v", where, c.Name, cs)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: container %s: want a memory request and limit", where, c.Name)
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s: container %s: want readiness and liveness probes", where, c.Name)
		}
		if host, _, _ := strings.Cut(c.Image, "/"); !strings.Contains(host, ".") || !strings.Contains(c.Image, ":") {
			t.Errorf("%s: container %s: image %q: want a registry and a tag", where, c.Name, c.Image)
		}
		if c.Image == "" || strings.HasSuffix(c.Image, ":latest") {
			t.Errorf("%s: container %s: image %q", where, c.Name, c.Image)
		}
	}
}

// checkSingleNodePostgres: the services' database is the StatefulSet
// assay-pg, reached through its Service on 5432, its role and database
// those of the uri deploy/README.md makes, its password the Secret's.
func checkSingleNodePostgres(t *testing.T, s *set) {
	t.Helper()
	pg := s.statefulSets["assay-pg"]
	if pg == nil {
		t.Fatalf("%s: no StatefulSet assay-pg", s.dir)
	}
	c := pg.Spec.Template.Spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if r := env["POSTGRES_PASSWORD"].ValueFrom; r == nil || r.SecretKeyRef == nil || r.SecretKeyRef.Name != "assay-pg-app" ||
		!slices.Contains(secrets["assay-pg-app"], r.SecretKeyRef.Key) {
		t.Errorf("%s: assay-pg's password is not a listed key of the Secret assay-pg-app", s.dir)
	}
	pgdata := env["PGDATA"].Value
	if m := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == pg.Spec.VolumeClaimTemplates[0].Name && strings.HasPrefix(pgdata, m.MountPath+"/")
	}); m < 0 {
		t.Errorf("%s: PGDATA %q is not a directory on the claimed volume", s.dir, pgdata)
	}
	svc := s.services["assay-pg"]
	if svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == 5432 }) {
		t.Fatalf("%s: no Service assay-pg on 5432", s.dir)
	}
	// The uri deploy/README.md has you make names this Service, role and
	// database.
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("postgres://%s:$PW@%s:5432/%s", env["POSTGRES_USER"].Value, svc.Name, env["POSTGRES_DB"].Value)
	if !strings.Contains(string(readme), want) {
		t.Errorf("deploy/README.md does not make assay-pg-app's uri as %s", want)
	}
}

// checkSingleNodeNATS: the server's configuration (the ConfigMap it
// mounts) runs JetStream with its store on the claimed volume, listens
// where its container port and its Service say, and every service's
// ASSAY_NATS_URL is that Service.
func checkSingleNodeNATS(t *testing.T, s *set) {
	t.Helper()
	ss := s.statefulSets["nats"]
	if ss == nil {
		t.Fatalf("%s: no StatefulSet nats", s.dir)
	}
	opts := singleNodeNATSOptions(t, s)
	c := ss.Spec.Template.Spec.Containers[0]
	if !opts.JetStream || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == ss.Spec.VolumeClaimTemplates[0].Name && m.MountPath == opts.StoreDir
	}) {
		t.Errorf("%s: nats.conf: JetStream %v, store %q: want it on the claimed volume", s.dir, opts.JetStream, opts.StoreDir)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if int(ports["nats"]) != opts.Port || int(ports["monitor"]) != opts.HTTPPort {
		t.Errorf("%s: nats.conf listens on %d (monitoring %d), the container ports are %v", s.dir, opts.Port, opts.HTTPPort, ports)
	}
	for _, pr := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Port.String() != "monitor" {
			t.Errorf("%s: the server's probes are not on its monitoring port", s.dir)
		}
	}
	var want []string
	for _, svc := range s.services {
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ss.Spec.Template.Labels)) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.TargetPort.String() == "nats" || p.TargetPort.IntValue() == opts.Port {
				want = append(want, fmt.Sprintf("nats://%s:%d", svc.Name, p.Port))
			}
		}
	}
	if len(want) != 1 {
		t.Fatalf("%s: want one Service port onto the server's client port, have %v", s.dir, want)
	}
	for _, name := range services {
		c := s.deployments[name].Spec.Template.Spec.Containers[0]
		if got := envValue(c, "ASSAY_NATS_URL"); got != want[0] {
			t.Errorf("%s: %s: ASSAY_NATS_URL %q, want %s", s.dir, name, got, want[0])
		}
		// One account (the server's own), so nothing is in another.
		for _, v := range []string{"ASSAY_PLACEMENT_NATS_URL", "ASSAY_GITHUB_BUDGET_NATS_URL"} {
			if hasEnv(c, v) {
				t.Errorf("%s: %s sets %s: the server has one account", s.dir, name, v)
			}
		}
	}
}

// singleNodeNATSOptions are the options of the server's configuration,
// as nats-server reads the ConfigMap it mounts.
func singleNodeNATSOptions(t *testing.T, s *set) *server.Options {
	t.Helper()
	ss := s.statefulSets["nats"]
	c := ss.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Command, "--config")
	if i < 0 || i+1 >= len(c.Command) {
		t.Fatalf("%s: the server's command %v names no --config", s.dir, c.Command)
	}
	conf := c.Command[i+1]
	v := mountOf(c, ss.Spec.Template.Spec, filepath.Dir(conf))
	if v == nil || v.ConfigMap == nil || s.configMaps[v.ConfigMap.Name] == nil {
		t.Fatalf("%s: %s is not in a rendered ConfigMap's mount", s.dir, conf)
	}
	text, ok := s.configMaps[v.ConfigMap.Name].Data[filepath.Base(conf)]
	if !ok {
		t.Fatalf("%s: ConfigMap %s has no %s", s.dir, v.ConfigMap.Name, filepath.Base(conf))
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%s: %s: %v", s.dir, conf, err)
	}
	return opts
}

// TestTrialDocumented: deploy/README.md starts with the trial, and gives
// the commands it takes: the namespace, every Secret its pods read (with
// the keys they read), the apply of the overlay, a tenant's token and the
// API through a port-forward to the ingress Service's http port.
func TestTrialDocumented(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "## Try it on one node")
	end := strings.Index(readme[max(start, 0):], "\n## ")
	if start < 0 || end < 0 || strings.Index(readme, "\n## ") != start-1 {
		t.Fatalf("deploy/README.md has no section \"Try it on one node\" before the others")
	}
	section := readme[start : start+end]
	for cell := range singleNode {
		s, _ := loadCell(t, cell)
		for _, want := range []string{"kubectl apply -k deploy/k8s/" + cellDir(cell) + "/namespace", "kubectl apply -k deploy/k8s/" + cellDir(cell),
			"tenant add", "port-forward svc/ingress 8080:http", "Authorization: Bearer"} {
			if !strings.Contains(section, want) {
				t.Errorf("the trial's section does not say %q", want)
			}
		}
		// Every Secret its pods read, with each key.
		for name, p := range podSpecs(s) {
			for _, c := range p.Spec.Containers {
				for _, e := range c.Env {
					if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
						continue
					}
					r := e.ValueFrom.SecretKeyRef
					if (r.Optional == nil || !*r.Optional) && !strings.Contains(section, "create secret generic "+r.Name) {
						t.Errorf("%s reads the Secret %s, which the trial's section does not make", name, r.Name)
					}
					if (r.Optional == nil || !*r.Optional) && !strings.Contains(section, "--from-literal="+r.Key+"=") {
						t.Errorf("%s reads the key %s of %s, which the trial's section does not set", name, r.Key, r.Name)
					}
				}
			}
		}
		for n, ss := range s.statefulSets {
			for _, e := range ss.Spec.Template.Spec.Containers[0].Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && !strings.Contains(section, "--from-literal="+r.SecretKeyRef.Key+"=") {
					t.Errorf("StatefulSet %s reads the key %s of %s, which the trial's section does not set", n, r.SecretKeyRef.Key, r.SecretKeyRef.Name)
				}
			}
		}
		// The API's port, named as the Service names it.
		if svc := s.services["ingress"]; svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "http" && p.Port == 8080 }) {
			t.Errorf("the Service ingress has no port http on 8080")
		}
		// The tenant's home region is the cell's.
		region := cellConfig(t, s).Data["region"]
		if !strings.Contains(section, "--home-region "+region) || !strings.Contains(section, "ASSAY_REGIONS="+cellConfig(t, s).Data["regions"]) {
			t.Errorf("the trial's section does not add the tenant in region %s", region)
		}
	}
}
