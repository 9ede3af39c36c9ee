package k8s

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"assay.dev/pkg/event"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ledger"
)

// services are assay's four service binaries, each a Deployment of the
// same name.
var services = []string{"ingress", "classifier", "committer", "ledger"}

// secrets are the Secrets the manifests and the NATS values name, with the
// keys they read. None is in the repository; deploy/README.md says how each
// is made.
var secrets = map[string][]string{
	"assay-pg-app":         {"uri", "password"},
	"assay-pg-ca":          {"ca.crt"},
	"assay-pg-backup":      {"ACCESS_KEY_ID", "ACCESS_SECRET_KEY", "ca.crt"},
	"assay-nats-urls":      {"ingress", "classifier", "committer", "ledger", "placement", "publisher"},
	"assay-nats-passwords": nil, // every line of assay nats-config --passwords
	"assay-model":          {"api-key"},
	"assay-github":         {"webhook-secret", "token", "app-id", "private-key.pem"},
	"nats-ca":              {"ca.crt"},
	"nats-tls":             {"tls.crt", "tls.key"},
	"nats-cluster-tls":     {"tls.crt", "tls.key"},
}

// set is one rendered kustomization, decoded into its types.
type set struct {
	dir          string
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	pdbs         map[string]*policyv1.PodDisruptionBudget
	accounts     map[string]*corev1.ServiceAccount
	policies     map[string]*networkingv1.NetworkPolicy
	configMaps   map[string]*corev1.ConfigMap
	jobs         map[string]*batchv1.Job
	namespaces   map[string]*corev1.Namespace
	clusters     map[string]*cnpgCluster
	backups      map[string]*cnpgScheduledBackup
	objectStores map[string]*barmanObjectStoreCR
	scaledObject map[string]*kedaScaledObject
}

// load renders dir and decodes every object strictly into its published
// Kubernetes type (or the hand-written custom resource types); an object of
// any other kind fails the test.
func load(t *testing.T, dir string) *set {
	t.Helper()
	s := &set{dir: dir,
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{}, services: map[string]*corev1.Service{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, accounts: map[string]*corev1.ServiceAccount{},
		policies: map[string]*networkingv1.NetworkPolicy{}, configMaps: map[string]*corev1.ConfigMap{},
		jobs: map[string]*batchv1.Job{}, namespaces: map[string]*corev1.Namespace{},
		clusters: map[string]*cnpgCluster{}, backups: map[string]*cnpgScheduledBackup{},
		scaledObject: map[string]*kedaScaledObject{}, objectStores: map[string]*barmanObjectStoreCR{},
	}
	for _, o := range render(t, dir) {
		var err error
		switch o.APIVersion + " " + o.Kind {
		case "apps/v1 Deployment":
			err = into(o, s.deployments)
		case "apps/v1 StatefulSet":
			err = into(o, s.statefulSets)
		case "v1 Service":
			err = into(o, s.services)
		case "policy/v1 PodDisruptionBudget":
			err = into(o, s.pdbs)
		case "v1 ServiceAccount":
			err = into(o, s.accounts)
		case "networking.k8s.io/v1 NetworkPolicy":
			err = into(o, s.policies)
		case "v1 ConfigMap":
			err = into(o, s.configMaps)
		case "batch/v1 Job":
			err = into(o, s.jobs)
		case "v1 Namespace":
			err = into(o, s.namespaces)
		case "postgresql.cnpg.io/v1 Cluster":
			err = into(o, s.clusters)
		case "postgresql.cnpg.io/v1 ScheduledBackup":
			err = into(o, s.backups)
		case "barmancloud.cnpg.io/v1 ObjectStore":
			err = into(o, s.objectStores)
		case "keda.sh/v1alpha1 ScaledObject":
			err = into(o, s.scaledObject)
		default:
			err = fmt.Errorf("a kind this test does not know (a Secret is never committed)")
		}
		if err != nil {
			t.Errorf("%s: %s %s/%s: %v", dir, o.APIVersion, o.Kind, o.Name, err)
		}
	}
	return s
}

func into[T any](o object, m map[string]*T) error {
	if _, dup := m[o.Name]; dup {
		return fmt.Errorf("rendered twice")
	}
	v := new(T)
	if err := strict(o.JSON, v); err != nil {
		return err
	}
	m[o.Name] = v
	return nil
}

func cellDir(cell string) string    { return "overlays/" + cell }
func migrateDir(cell string) string { return "overlays/" + cell + "/migrate" }

// loadCell renders a cell's overlay and its migration Job's: the Job's own
// kustomization (overlays/<cell>/migrate), or, for a cell on one node
// whose overlay holds its Job (overlays/trial), the overlay without its
// Deployments.
func loadCell(t *testing.T, cell string) (s, m *set) {
	t.Helper()
	s = load(t, cellDir(cell))
	if !singleNode[cell] {
		return s, load(t, migrateDir(cell))
	}
	job := *s
	job.deployments = map[string]*appsv1.Deployment{}
	return s, &job
}

// TestOverlaysRenderAndDecode renders every kustomization a cell is
// installed from and checks what each object says against the others.
func TestOverlaysRenderAndDecode(t *testing.T) {
	for _, cell := range cellIDs {
		t.Run(cell, func(t *testing.T) {
			s, m := loadCell(t, cell)
			ns, regionNS := "assay-"+cell, "assay-"+cells[cell]
			for _, x := range []*set{s, m} {
				checkNamespace(t, x, ns)
			}
			// A region's first cell lives in the namespace its region's NATS
			// kustomization makes; another cell, and a cell on one node,
			// brings its own.
			home := "nats/" + cell
			if cells[cell] != cell || singleNode[cell] {
				home = cellDir(cell) + "/namespace"
			}
			h := load(t, home)
			if got := h.namespaces[ns]; got == nil || got.Labels["assay.dev/region"] != cells[cell] || got.Labels["assay.dev/cell"] != cell {
				t.Errorf("%s: want the Namespace %s labelled with cell %s and region %s, have %v", home, ns, cell, cells[cell], keys(h.namespaces))
			}
			checkNamespace(t, h, ns)
			checkCellConfig(t, s, cell)
			checkCellConfig(t, m, cell)
			if a, b := cellConfig(t, s), cellConfig(t, m); !mapsEqual(a.Data, b.Data) {
				t.Errorf("%s: the migration Job's assay-cell %v differs from the services' %v", cell, b.Data, a.Data)
			}
			checkDeployments(t, s)
			checkJob(t, m)
			checkSelectors(t, s)
			for _, dir := range natsDirs(cell) {
				n := load(t, dir)
				checkNamespace(t, n, regionNS)
				if len(n.namespaces) != 1 || n.namespaces[regionNS] == nil {
					t.Errorf("%s: want the one Namespace %s, have %v", dir, regionNS, keys(n.namespaces))
				}
				if cm := n.configMaps["nats-assay-accounts"]; cm == nil || cm.Data["assay.conf"] == "" {
					t.Errorf("%s: no ConfigMap nats-assay-accounts with assay.conf", dir)
				}
				checkPolicies(t, s, n, cell, true)
				// The Job shares the cell's policies; the services' select none of its pods.
				checkPolicies(t, m, n, cell, false)
			}
			checkEnvRefs(t, s, podSpecs(s))
			checkEnvRefs(t, m, podSpecs(m))
			checkImages(t, s, m)
			if singleNode[cell] {
				// Its NATS server is its own, rendered with it.
				checkPolicies(t, s, s, cell, true)
				checkPolicies(t, m, s, cell, false)
				checkSingleNode(t, s, m)
				return
			}
			checkPostgres(t, s)
			checkScaling(t, s, cell)
		})
	}
}

func checkNamespace(t *testing.T, s *set, ns string) {
	t.Helper()
	for _, o := range render(t, s.dir) {
		var lm struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := jsonLoose(o.JSON, &lm); err != nil {
			t.Fatal(err)
		}
		// A label-selected apply or prune (-l app.kubernetes.io/part-of=assay)
		// of a cell must take every object of it, or pods lose what they
		// read, and nothing of another kustomization: nats/<cell> is
		// assay-nats, and its Namespace carries no part-of at all (a prune
		// would take the namespace with it).
		want := "assay"
		if strings.HasPrefix(s.dir, "nats/") {
			want = "assay-nats"
		}
		if got := lm.Metadata.Labels["app.kubernetes.io/part-of"]; o.Kind == "Namespace" && got != "" || o.Kind != "Namespace" && got != want {
			t.Errorf("%s: %s/%s: app.kubernetes.io/part-of %q, want %q", s.dir, o.Kind, o.Name, got, map[bool]string{true: "", false: want}[o.Kind == "Namespace"])
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := jsonLoose(o.JSON, &meta); err != nil {
			t.Fatal(err)
		}
		if o.Kind == "Namespace" {
			continue
		}
		if meta.Metadata.Namespace != ns {
			t.Errorf("%s: %s/%s is in namespace %q, want %q", s.dir, o.Kind, o.Name, meta.Metadata.Namespace, ns)
		}
	}
}

func cellConfig(t *testing.T, s *set) *corev1.ConfigMap {
	t.Helper()
	var found []*corev1.ConfigMap
	for name, cm := range s.configMaps {
		if strings.HasPrefix(name, "assay-cell-") {
			found = append(found, cm)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one ConfigMap assay-cell-<hash>, have %d", s.dir, len(found))
	}
	return found[0]
}

func checkCellConfig(t *testing.T, s *set, cell string) {
	t.Helper()
	d := cellConfig(t, s).Data
	if d["cell"] != cell || d["region"] != cells[cell] {
		t.Errorf("%s: assay-cell cell %q region %q, want %q in %q", s.dir, d["cell"], d["region"], cell, cells[cell])
	}
	if !slices.Contains(strings.Split(d["regions"], ","), cells[cell]) {
		t.Errorf("%s: assay-cell regions %q lacks %q", s.dir, d["regions"], cells[cell])
	}
	// The other cells of the region send this cell's tenants' requests to
	// its ingress Service, in its namespace, on the API port.
	if want := "http://ingress.assay-" + cell + ".svc.cluster.local:8080"; d["cell-url"] != want {
		t.Errorf("%s: assay-cell cell-url %q, want %q", s.dir, d["cell-url"], want)
	}
}

// podSpecs are the pod templates of a set, by workload name.
func podSpecs(s *set) map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for n, d := range s.deployments {
		out["Deployment/"+n] = &d.Spec.Template
	}
	for n, j := range s.jobs {
		out["Job/"+n] = &j.Spec.Template
	}
	return out
}

func checkDeployments(t *testing.T, s *set) {
	t.Helper()
	if got := keys(s.deployments); !slices.Equal(got, sorted(services)) {
		t.Fatalf("%s: Deployments %v, want %v", s.dir, got, sorted(services))
	}
	for _, name := range services {
		d := s.deployments[name]
		p := d.Spec.Template.Spec
		if len(p.Containers) != 1 || p.Containers[0].Name != name {
			t.Errorf("%s: %s: want one container named %s", s.dir, name, name)
			continue
		}
		c := p.Containers[0]
		if got := c.Command; !slices.Equal(got, []string{"/usr/local/bin/" + name}) {
			t.Errorf("%s: %s: command %v", s.dir, name, got)
		}
		// The drain (25 s) and the HTTP shutdown (10 s) must fit.
		if g := p.TerminationGracePeriodSeconds; g == nil || *g <= 35 {
			t.Errorf("%s: %s: terminationGracePeriodSeconds %s, want > 35", s.dir, name, fmtInt64(g))
		}
		if p.ServiceAccountName != name || s.accounts[name] == nil {
			t.Errorf("%s: %s: service account %q not rendered", s.dir, name, p.ServiceAccountName)
		}
		if a := p.AutomountServiceAccountToken; a == nil || *a {
			t.Errorf("%s: %s: the API token is mounted; the services never call the Kubernetes API", s.dir, name)
		}
		checkSecurity(t, s.dir+": "+name, p, c)
		checkRuntime(t, s, s.dir+": "+name, p, c)
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: %s: resources %v: want cpu and memory requests and a memory limit", s.dir, name, c.Resources)
		}
		keysSpread := map[string]bool{}
		for _, tsc := range p.TopologySpreadConstraints {
			keysSpread[tsc.TopologyKey] = true
			sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
			if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) || sel.Empty() {
				t.Errorf("%s: %s: topology spread on %s does not select its own pods", s.dir, name, tsc.TopologyKey)
			}
		}
		if !keysSpread["topology.kubernetes.io/zone"] || !keysSpread["kubernetes.io/hostname"] {
			t.Errorf("%s: %s: spread over zones and nodes, have %v", s.dir, name, keysSpread)
		}
		ports := map[string]int32{}
		for _, cp := range c.Ports {
			ports[cp.Name] = cp.ContainerPort
		}
		for what, pr := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			want := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}[what]
			if pr == nil || pr.HTTPGet == nil {
				t.Errorf("%s: %s: no %s probe", s.dir, name, what)
				continue
			}
			if pr.HTTPGet.Path != want {
				t.Errorf("%s: %s: %s probe on %s, want %s", s.dir, name, what, pr.HTTPGet.Path, want)
			}
			if _, ok := ports[pr.HTTPGet.Port.String()]; !ok {
				t.Errorf("%s: %s: %s probe port %s is not a container port %v", s.dir, name, what, pr.HTTPGet.Port.String(), ports)
			}
		}
		// The startup probe covers ASSAY_STARTUP_WAIT (60 s by default).
		if sp := c.StartupProbe; sp != nil && sp.PeriodSeconds*sp.FailureThreshold <= 60 {
			t.Errorf("%s: %s: the startup probe gives up after %d s, before the 60 s start-up wait", s.dir, name, sp.PeriodSeconds*sp.FailureThreshold)
		}
		if addr := envValue(c, "ASSAY_HTTP_ADDR"); addr != ":"+strconv.Itoa(int(ports["http"])) {
			t.Errorf("%s: %s: ASSAY_HTTP_ADDR %q does not listen on the http container port %d", s.dir, name, addr, ports["http"])
		}
		if p := s.pdbs[name]; p == nil {
			t.Errorf("%s: %s: no PodDisruptionBudget", s.dir, name)
		} else if pol := p.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
			// Readiness follows NATS and Postgres: in their outage every pod
			// is unready, and IfHealthyBudget would block every drain.
			t.Errorf("%s: %s: the PodDisruptionBudget keeps unready pods (unhealthyPodEvictionPolicy %v, want AlwaysAllow)", s.dir, name, pol)
		}
		if addr := envValue(c, "ASSAY_METRICS_ADDR"); ports["metrics"] == 0 || addr != ":"+strconv.Itoa(int(ports["metrics"])) || ports["metrics"] == ports["http"] {
			t.Errorf("%s: %s: ASSAY_METRICS_ADDR %q is not a metrics container port of its own %v", s.dir, name, addr, ports)
		}
		if sv := s.services[name]; sv != nil && !slices.ContainsFunc(sv.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" }) {
			t.Errorf("%s: %s: its Service has no metrics port for a ServiceMonitor", s.dir, name)
		}
		if s.services[name] == nil {
			t.Errorf("%s: %s: no Service for its metrics", s.dir, name)
		}
	}
	// Every service that creates a stream creates it with a replica on
	// each of the cell's NATS servers, placed on them when there are
	// several (one server has nothing to place).
	owners := streamOwners(t, s.cell())
	if len(owners) < 3 {
		t.Fatalf("%s: stream owners %v: the accounts file is not the one this test reads", s.dir, owners)
	}
	servers := natsServers(t, s)
	for name, streams := range owners {
		c := s.deployments[name].Spec.Template.Spec.Containers[0]
		if envValue(c, "ASSAY_STREAM_REPLICAS") != strconv.Itoa(servers) || hasEnv(c, "ASSAY_STREAM_PLACEMENT") != (servers > 1) {
			t.Errorf("%s: %s creates %v: want ASSAY_STREAM_REPLICAS=%d, and ASSAY_STREAM_PLACEMENT with more than one server", s.dir, name, streams, servers)
		}
	}
}

// natsServers is how many NATS servers serve the cell of s: the replicas
// of its own server's StatefulSet (nats/single), else the cluster's in its
// region's Helm values.
func natsServers(t *testing.T, s *set) int {
	t.Helper()
	if n := s.statefulSets["nats"]; n != nil {
		if n.Spec.Replicas == nil {
			return 1
		}
		return int(*n.Spec.Replicas)
	}
	return natsValues(t, cells[s.cell()]).Config.Cluster.Replicas
}

// streamOwners are the services of a cell that may create a stream, with
// the streams, as the cell's NATS accounts file (assay nats-config, the
// services' own naming code) grants them: the owners of the cell's
// streams, however many there are. Key-value buckets are left out.
func streamOwners(t *testing.T, cell string) map[string][]string {
	t.Helper()
	var conf []byte
	var err error
	if dirs := natsDirs(cell); len(dirs) > 0 {
		conf, err = os.ReadFile(dirs[0] + "/assay.conf")
	} else {
		// A cell whose NATS server has no accounts (nats/single): what the
		// generator grants a cell of that name.
		conf, err = exec.Command(binary(t, "assay"), "nats-config", "--cells", cellsFlag([]string{cell})).Output()
	}
	if err != nil {
		t.Fatal(err)
	}
	user := regexp.MustCompile(`user: "([a-z0-9-]+)"`)
	ours := regexp.MustCompile(`^[a-z0-9]+-` + regexp.QuoteMeta(cell) + `-([a-z]+)$`)
	create := regexp.MustCompile(`"\$JS\.API\.STREAM\.CREATE\.([A-Za-z0-9_-]+)"`)
	out := map[string][]string{}
	who := ""
	for _, line := range strings.Split(string(conf), "\n") {
		if m := user.FindStringSubmatch(line); m != nil {
			// Another cell's user (us-2's beside us's) owns nothing of this one.
			who = ""
			if o := ours.FindStringSubmatch(m[1]); o != nil {
				who = o[1]
			}
		}
		if m := create.FindStringSubmatch(line); m != nil && who != "" && !strings.HasPrefix(m[1], "KV_") {
			out[who] = append(out[who], m[1])
		}
	}
	return out
}

func checkSecurity(t *testing.T, where string, p corev1.PodSpec, c corev1.Container) {
	t.Helper()
	ps, cs := p.SecurityContext, c.SecurityContext
	switch {
	case ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532:
		t.Errorf("%s: the pod must run as non-root user 65532", where)
	case ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: no RuntimeDefault seccomp profile", where)
	case cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem:
		t.Errorf("%s: the root filesystem is writable", where)
	case cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation:
		t.Errorf("%s: privilege escalation is allowed", where)
	case cs.Privileged != nil && *cs.Privileged:
		t.Errorf("%s: privileged", where)
	case cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(cs.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities %v: drop ALL, add none", where, cs.Capabilities)
	}
}

func checkJob(t *testing.T, s *set) {
	t.Helper()
	j := s.jobs["assay-migrate"]
	if j == nil || len(s.jobs) != 1 || len(s.deployments) != 0 {
		t.Fatalf("%s: want the one Job assay-migrate and no Deployment", s.dir)
	}
	p := j.Spec.Template.Spec
	c := p.Containers[0]
	if !slices.Equal(c.Command, []string{"/usr/local/bin/assay", "migrate", "--create-database"}) {
		t.Errorf("%s: migration command %v", s.dir, c.Command)
	}
	if p.RestartPolicy != corev1.RestartPolicyNever && p.RestartPolicy != corev1.RestartPolicyOnFailure {
		t.Errorf("%s: restartPolicy %q", s.dir, p.RestartPolicy)
	}
	if s.accounts[p.ServiceAccountName] == nil {
		t.Errorf("%s: service account %q not rendered", s.dir, p.ServiceAccountName)
	}
	checkSecurity(t, s.dir+": assay-migrate", p, c)
	checkRuntime(t, s, s.dir+": assay-migrate", p, c)
	// A Job that deletes itself is made again by every GitOps sync; one that
	// stays must be replaced, not patched, by a new release.
	if j.Spec.TTLSecondsAfterFinished != nil {
		t.Errorf("%s: assay-migrate: ttlSecondsAfterFinished %d: Argo CD and Flux would make it again after it", s.dir, *j.Spec.TTLSecondsAfterFinished)
	}
	for k, v := range map[string]string{"argocd.argoproj.io/hook": "Sync", "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
		"kustomize.toolkit.fluxcd.io/force": "Enabled"} {
		if j.Annotations[k] != v {
			t.Errorf("%s: assay-migrate: annotation %s %q, want %q", s.dir, k, j.Annotations[k], v)
		}
	}
}

// checkRuntime: the Go runtime collects before the container's memory
// limit (GOMEMLIMIT between 80 and 95 % of it), and Postgres's certificate
// is verified (PGSSLMODE verify-full against the CloudNativePG CA, mounted
// from assay-pg-ca) — except on one node, whose Postgres has no TLS
// (PGSSLMODE disable, said outright, and no CA).
func checkRuntime(t *testing.T, s *set, where string, p corev1.PodSpec, c corev1.Container) {
	t.Helper()
	limit := c.Resources.Limits.Memory().Value()
	gml, err := goMemLimit(envValue(c, "GOMEMLIMIT"))
	if err != nil || limit == 0 || float64(gml) < 0.8*float64(limit) || float64(gml) > 0.95*float64(limit) {
		t.Errorf("%s: GOMEMLIMIT %q (%v) is not 80–95 %% of the memory limit %d", where, envValue(c, "GOMEMLIMIT"), err, limit)
	}
	if singleNode[s.cell()] {
		if envValue(c, "PGSSLMODE") != "disable" || hasEnv(c, "PGSSLROOTCERT") || hasEnv(c, "SSL_CERT_DIR") {
			t.Errorf("%s: on one node: want PGSSLMODE=disable, no PGSSLROOTCERT and no SSL_CERT_DIR (no TLS there)", where)
		}
		for _, v := range p.Volumes {
			if v.Secret != nil && (v.Secret.SecretName == "assay-pg-ca" || v.Secret.SecretName == "nats-ca") {
				t.Errorf("%s: on one node: mounts the Secret %s, which no one makes there", where, v.Secret.SecretName)
			}
		}
		return
	}
	if envValue(c, "PGSSLMODE") != "verify-full" {
		t.Errorf("%s: PGSSLMODE %q, want verify-full", where, envValue(c, "PGSSLMODE"))
	}
	root := envValue(c, "PGSSLROOTCERT")
	v := mountOf(c, p, filepath.Dir(root))
	if v == nil || v.Secret == nil || v.Secret.SecretName != "assay-pg-ca" ||
		!slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Key == "ca.crt" && k.Path == filepath.Base(root) }) {
		t.Errorf("%s: PGSSLROOTCERT %q is not ca.crt of the mounted Secret assay-pg-ca", where, root)
	}
}

// goMemLimit reads GOMEMLIMIT as the Go runtime does: a byte count with an
// optional B, KiB, MiB, GiB or TiB.
func goMemLimit(v string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("not a byte count")
	}
	return n * mult, nil
}

// checkSelectors: every selector selects what it is for.
func checkSelectors(t *testing.T, s *set) {
	t.Helper()
	for name, d := range s.deployments {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s: Deployment %s: selector %v does not match its template's labels %v", s.dir, name, d.Spec.Selector, d.Spec.Template.Labels)
		}
		for other, o := range s.deployments {
			if other != name && sel.Matches(labels.Set(o.Spec.Template.Labels)) {
				t.Errorf("%s: Deployment %s's selector also selects %s's pods", s.dir, name, other)
			}
		}
	}
	for name, p := range s.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("%s: PDB %s: bad selector", s.dir, name)
			continue
		}
		if got := selected(sel, s); !slices.Equal(got, []string{name}) {
			t.Errorf("%s: PDB %s selects the pods of %v, want [%s]", s.dir, name, got, name)
		}
		if p.Spec.MaxUnavailable == nil && p.Spec.MinAvailable == nil {
			t.Errorf("%s: PDB %s bounds nothing", s.dir, name)
		}
	}
	for name, svc := range s.services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		got := selected(sel, s)
		var sts []string
		for n, ss := range s.statefulSets {
			if sel.Matches(labels.Set(ss.Spec.Template.Labels)) {
				sts = append(sts, n)
			}
		}
		if len(svc.Spec.Selector) == 0 || len(got)+len(sts) != 1 {
			t.Errorf("%s: Service %s selects %v %v, want one Deployment or StatefulSet", s.dir, name, got, sts)
			continue
		}
		var c corev1.Container
		if len(got) == 1 {
			c = s.deployments[got[0]].Spec.Template.Spec.Containers[0]
		} else {
			got = sts
			c = s.statefulSets[sts[0]].Spec.Template.Spec.Containers[0]
		}
		for _, sp := range svc.Spec.Ports {
			ok := false
			for _, cp := range c.Ports {
				if sp.TargetPort.String() == cp.Name || sp.TargetPort.IntValue() == int(cp.ContainerPort) {
					ok = ok || cp.Protocol == sp.Protocol || (cp.Protocol == "" && sp.Protocol == "TCP")
				}
			}
			if !ok {
				t.Errorf("%s: Service %s port %s: targetPort %s is not a container port of %s", s.dir, name, sp.Name, sp.TargetPort.String(), got[0])
			}
		}
	}
}

func selected(sel labels.Selector, s *set) []string {
	var out []string
	for _, n := range keys(s.deployments) {
		if sel.Matches(labels.Set(s.deployments[n].Spec.Template.Labels)) {
			out = append(out, n)
		}
	}
	return out
}

// checkEnvRefs: every ConfigMap a pod reads is rendered with the key; every
// Secret is one deploy/README.md documents, with the key.
func checkEnvRefs(t *testing.T, s *set, pods map[string]*corev1.PodTemplateSpec) {
	t.Helper()
	for name, p := range pods {
		for _, c := range p.Spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
					cm := s.configMaps[r.Name]
					if cm == nil {
						t.Errorf("%s: %s: %s reads ConfigMap %s, not rendered", s.dir, name, e.Name, r.Name)
					} else if _, ok := cm.Data[r.Key]; !ok {
						t.Errorf("%s: %s: %s reads key %s of ConfigMap %s, which has %v", s.dir, name, e.Name, r.Key, r.Name, keys(cm.Data))
					}
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil {
					if !slices.Contains(secrets[r.Name], r.Key) {
						t.Errorf("%s: %s: %s reads Secret %s key %s, which is not in the list of Secrets", s.dir, name, e.Name, r.Name, r.Key)
					}
				}
			}
		}
		for _, v := range p.Spec.Volumes {
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					if !slices.Contains(secrets[v.Secret.SecretName], it.Key) {
						t.Errorf("%s: %s: volume %s reads Secret %s key %s, not in the list", s.dir, name, v.Name, v.Secret.SecretName, it.Key)
					}
				}
			}
		}
	}
}

// TestSecretsDocumented: deploy/README.md says how to make every Secret the
// manifests name, with its keys.
func TestSecretsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, ks := range secrets {
		if !strings.Contains(string(readme), "`"+name+"`") {
			t.Errorf("deploy/README.md does not say how to make the Secret %s", name)
		}
		for _, k := range ks {
			if !strings.Contains(string(readme), "`"+k+"`") {
				t.Errorf("deploy/README.md does not name the key %s of the Secret %s", k, name)
			}
		}
	}
}

// TestStrictDecoding: the decoder the tests rely on refuses a misspelt
// field, in a published type and in a hand-written one.
func TestStrictDecoding(t *testing.T) {
	var d appsv1.Deployment
	if err := strict([]byte(`{"spec":{"template":{"spec":{"terminationGracePeriod":45}}}}`), &d); err == nil {
		t.Error("a misspelt Deployment field decoded")
	}
	var c cnpgCluster
	if err := strict([]byte(`{"spec":{"instances":3,"postgresql":{"synchronous":{"method":"any","number":1,"durability":"required"}}}}`), &c); err == nil {
		t.Error("a misspelt Cluster field decoded")
	}
	if err := strict([]byte(`{"spec":{"instances":3,"backup":{"barmanObjectStore":{"destinationPath":"s3://x"}}}}`), &c); err == nil {
		t.Error("the deprecated in-tree barmanObjectStore decoded")
	}
	var so kedaScaledObject
	if err := strict([]byte(`{"spec":{"scaleTargetRef":{"name":"x"},"maxReplicas":3,"triggers":[]}}`), &so); err == nil {
		t.Error("a misspelt ScaledObject field decoded")
	}
}

// checkImages: each container runs <registry>/assay/<binary>, at the one
// tag, the name fully qualified (a bare assay/<binary> is Docker Hub's).
func checkImages(t *testing.T, sets ...*set) {
	t.Helper()
	tags := map[string]bool{}
	for _, s := range sets {
		for name, p := range podSpecs(s) {
			for _, c := range p.Spec.Containers {
				bin := strings.TrimPrefix(c.Command[0], "/usr/local/bin/")
				repo, tag, ok := strings.Cut(c.Image, ":")
				if !ok || !strings.HasSuffix(repo, "/assay/"+bin) || tag == "" {
					t.Errorf("%s: %s: image %q, want <registry>/assay/%s:<tag>", s.dir, name, c.Image, bin)
				}
				if host, _, _ := strings.Cut(c.Image, "/"); !strings.ContainsAny(host, ".:") && host != "localhost" {
					t.Errorf("%s: %s: image %q names no registry: it would be pulled from docker.io", s.dir, name, c.Image)
				}
				tags[tag] = true
			}
		}
	}
	if len(tags) != 1 {
		t.Errorf("images carry tags %v, want one", keys(tags))
	}
}

// TestImagesAreWhatMakeImagesBuilds: the images every cell's pods pull are
// exactly the ones `make images` builds with its defaults (IMAGEFLAGS=-list
// prints their names and builds nothing), so a fresh clone's images are
// the ones its manifests name.
func TestImagesAreWhatMakeImagesBuilds(t *testing.T) {
	cmd := exec.Command("make", "-s", "--no-print-directory", "-C", "../..", "images", "IMAGEFLAGS=-list")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make images IMAGEFLAGS=-list: %v\n%s", err, out)
	}
	built := strings.Fields(string(out))
	for _, cell := range cells {
		pulled := map[string]bool{}
		s, m := loadCell(t, cell)
		for _, s := range []*set{s, m} {
			for _, p := range podSpecs(s) {
				for _, c := range p.Spec.Containers {
					pulled[c.Image] = true
				}
			}
		}
		if got, want := keys(pulled), sorted(built); !slices.Equal(got, want) {
			t.Errorf("%s: the pods pull %v; make images builds %v", cell, got, want)
		}
	}
}

func checkPostgres(t *testing.T, s *set) {
	t.Helper()
	c := s.clusters["assay-pg"]
	if c == nil || len(s.clusters) != 1 {
		t.Fatalf("%s: want the one CloudNativePG Cluster assay-pg, have %v", s.dir, keys(s.clusters))
	}
	sp := c.Spec
	if sp.Instances != 3 {
		t.Errorf("%s: %d instances, want 3", s.dir, sp.Instances)
	}
	// deploy/DURABILITY.md: Postgres keeps what it acknowledged, on a
	// standby too.
	for k, v := range map[string]string{"synchronous_commit": "on", "fsync": "on", "full_page_writes": "on"} {
		if got, ok := sp.PostgreSQL.Parameters[k]; ok && got != v || !ok && k == "synchronous_commit" {
			t.Errorf("%s: %s = %q, want %q", s.dir, k, got, v)
		}
	}
	if y := sp.PostgreSQL.Synchronous; y == nil || y.Number < 1 || (y.Method != "any" && y.Method != "first") || (y.DataDurability != "" && y.DataDurability != "required") {
		t.Errorf("%s: synchronous replication %+v: want method any or first, one standby or more, durability required", s.dir, y)
	}
	// WAL archiving and base backups go through the Barman Cloud Plugin to
	// the cell's ObjectStore, at the cell's own path.
	var archiver *cnpgPlugin
	for i, p := range sp.Plugins {
		if p.IsWALArchiver != nil && *p.IsWALArchiver {
			archiver = &sp.Plugins[i]
		}
	}
	if archiver == nil || archiver.Name != barmanPlugin {
		t.Fatalf("%s: plugins %+v: want %s as the WAL archiver", s.dir, sp.Plugins, barmanPlugin)
	}
	store := s.objectStores[archiver.Parameters["barmanObjectName"]]
	if store == nil || len(s.objectStores) != 1 {
		t.Fatalf("%s: the archiver's ObjectStore %q is not rendered (have %v)", s.dir, archiver.Parameters["barmanObjectName"], keys(s.objectStores))
	}
	b := store.Spec.Configuration
	if !strings.HasSuffix(b.DestinationPath, "/"+s.namespaceCell()) || b.ServerName != "" {
		t.Errorf("%s: object store %+v: want the cell's own path and no serverName (the plugin's parameter names it)", s.dir, b)
	} else if cr := b.S3Credentials; cr == nil || cr.AccessKeyID == nil || !slices.Contains(secrets[cr.AccessKeyID.Name], cr.AccessKeyID.Key) ||
		cr.SecretAccessKey == nil || !slices.Contains(secrets[cr.SecretAccessKey.Name], cr.SecretAccessKey.Key) {
		t.Errorf("%s: backup credentials %+v are not the listed Secret's keys", s.dir, cr)
	}
	if store.Spec.RetentionPolicy == "" {
		t.Errorf("%s: ObjectStore %s keeps backups for ever: no retentionPolicy", s.dir, store.Name)
	}
	if init := sp.Bootstrap; init == nil || init.InitDB == nil || init.InitDB.Owner == "" {
		t.Errorf("%s: no initdb owner: the app Secret assay-pg-app is the owner's", s.dir)
	}
	if len(s.backups) != 1 {
		t.Errorf("%s: want one ScheduledBackup", s.dir)
	}
	for n, sb := range s.backups {
		if sb.Spec.Cluster.Name != "assay-pg" || len(strings.Fields(sb.Spec.Schedule)) != 6 {
			t.Errorf("%s: ScheduledBackup %s: cluster %q schedule %q (six fields, seconds first)", s.dir, n, sb.Spec.Cluster.Name, sb.Spec.Schedule)
		}
		// Without immediate there is no base backup to recover from until
		// the schedule first comes round.
		if sb.Spec.Immediate == nil || !*sb.Spec.Immediate {
			t.Errorf("%s: ScheduledBackup %s does not take a backup when it is made (immediate)", s.dir, n)
		}
		if sb.Spec.Method != "plugin" || sb.Spec.PluginConfiguration == nil || sb.Spec.PluginConfiguration.Name != barmanPlugin {
			t.Errorf("%s: ScheduledBackup %s: method %q %+v, want the plugin %s", s.dir, n, sb.Spec.Method, sb.Spec.PluginConfiguration, barmanPlugin)
		}
		if sb.Spec.Target != "" && sb.Spec.Target != "primary" && sb.Spec.Target != "prefer-standby" {
			t.Errorf("%s: ScheduledBackup %s: target %q", s.dir, n, sb.Spec.Target)
		}
	}
}

// barmanPlugin is the Barman Cloud Plugin's name in a Cluster's plugins.
const barmanPlugin = "barman-cloud.cloudnative-pg.io"

func (s *set) namespaceCell() string {
	return strings.TrimPrefix(strings.TrimPrefix(s.dir, "overlays/"), "/")
}

// cell is the cell of an overlay's set (overlays/<cell>, and what is
// under it), else "".
func (s *set) cell() string {
	rest, ok := strings.CutPrefix(s.dir, "overlays/")
	if !ok {
		return ""
	}
	cell, _, _ := strings.Cut(rest, "/")
	return cell
}

// checkScaling: the ScaledObjects scale the Deployments that exist, on the
// durables the code names for the cell, and the classifier's ceiling stays
// within the provider's allowance.
func checkScaling(t *testing.T, s *set, cell string) {
	t.Helper()
	names := event.Names{Installation: cellConfig(t, s).Data["installation"], Cell: cell}
	want := map[string][][2]string{
		"classifier": {{names.Stream(event.KindWork), classifier.Consumer(names, event.Interactive)}, {names.Stream(event.KindWork), classifier.Consumer(names, event.Batch)}},
		"committer":  {{names.Stream(event.KindAttempt), committer.Consumer(names)}},
		"ledger":     {{names.Stream(event.KindAttempt), ledger.Consumer(names)}},
	}
	// The account is the cell's in the NATS accounts file its servers load.
	account := strings.ToUpper(strings.ReplaceAll(names.Installation+"_"+cell, "-", "_"))
	for _, dir := range natsDirs(cell) {
		conf, err := os.ReadFile(dir + "/assay.conf")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(conf), "\n  "+account+" {\n") {
			t.Errorf("%s/assay.conf has no account %s", dir, account)
		}
	}
	if got := keys(s.scaledObject); !slices.Equal(got, keys(want)) {
		t.Fatalf("%s: ScaledObjects %v, want %v", s.dir, got, keys(want))
	}
	for name, so := range s.scaledObject {
		ref := so.Spec.ScaleTargetRef
		if ref == nil || s.deployments[ref.Name] == nil || (ref.Kind != "" && ref.Kind != "Deployment") {
			t.Errorf("%s: ScaledObject %s scales %+v, not a Deployment here", s.dir, name, ref)
			continue
		}
		if s.deployments[ref.Name].Spec.Replicas != nil {
			t.Errorf("%s: Deployment %s sets replicas, which every apply would reset under KEDA", s.dir, ref.Name)
		}
		lo, hi := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
		if lo == nil || hi == nil || *lo < 2 || *hi < *lo {
			t.Errorf("%s: ScaledObject %s: replicas %v..%v, want at least 2", s.dir, name, lo, hi)
		}
		// Without a fallback the HPA freezes where it was while NATS's
		// monitoring port cannot be read.
		if f := so.Spec.Fallback; f == nil || f.FailureThreshold < 1 || f.Replicas < *lo || f.Replicas > *hi {
			t.Errorf("%s: ScaledObject %s: fallback %+v, want one within its replicas", s.dir, name, f)
		}
		// cooldownPeriod applies to scaling to zero only; above it the HPA's
		// scale-down window is what waits.
		if so.Spec.CooldownPeriod != nil && *lo > 0 {
			t.Errorf("%s: ScaledObject %s: cooldownPeriod does nothing at minReplicaCount %d", s.dir, name, *lo)
		}
		if a := so.Spec.Advanced; a == nil || a.HorizontalPodAutoscalerConfig == nil || a.HorizontalPodAutoscalerConfig.Behavior == nil ||
			a.HorizontalPodAutoscalerConfig.Behavior.ScaleDown == nil || a.HorizontalPodAutoscalerConfig.Behavior.ScaleDown.StabilizationWindowSeconds == nil {
			t.Errorf("%s: ScaledObject %s: no scale-down stabilization window", s.dir, name)
		}
		var got [][2]string
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "nats-jetstream" {
				t.Errorf("%s: %s: trigger %q", s.dir, name, tr.Type)
			}
			for k := range tr.Metadata {
				if !natsJetStreamMetadata[k] {
					t.Errorf("%s: %s: trigger metadata %q is not the nats-jetstream scaler's", s.dir, name, k)
				}
			}
			if tr.Metadata["account"] != account {
				t.Errorf("%s: %s: account %q, want %q", s.dir, name, tr.Metadata["account"], account)
			}
			if ep := tr.Metadata["natsServerMonitoringEndpoint"]; ep != "nats-headless.assay-"+cells[cell]+".svc.cluster.local:8222" {
				t.Errorf("%s: %s: monitoring endpoint %q is not the NATS of the cell's region", s.dir, name, ep)
			}
			if _, err := strconv.Atoi(tr.Metadata["lagThreshold"]); err != nil {
				t.Errorf("%s: %s: lagThreshold %q", s.dir, name, tr.Metadata["lagThreshold"])
			}
			got = append(got, [2]string{tr.Metadata["stream"], tr.Metadata["consumer"]})
		}
		if fmt.Sprint(got) != fmt.Sprint(want[name]) {
			t.Errorf("%s: %s scales on %v, want %v", s.dir, name, got, want[name])
		}
	}
	// One Deployment serves both lanes, so it scales on their sum.
	so := s.scaledObject["classifier"]
	if a := so.Spec.Advanced; a == nil || a.ScalingModifiers.Formula != "interactive + batch" || a.ScalingModifiers.Target == "" {
		t.Errorf("%s: the classifier does not scale on the sum of its lanes", s.dir)
	}
	for _, tr := range so.Spec.Triggers {
		if !strings.Contains(so.Spec.Advanced.ScalingModifiers.Formula, tr.Name) || tr.Name == "" {
			t.Errorf("%s: classifier trigger %q is not in the formula", s.dir, tr.Name)
		}
	}
	checkProviderBudget(t, s, so.Annotations)
	checkSurge(t, s)
}

// checkProviderBudget: the classifier's ASSAY_MODEL_MAX_CONCURRENCY is the
// cell's ceiling, shared by every classifier pod through NATS, so it alone
// must stay within the provider's allowance; were it per pod
// (ASSAY_MODEL_CONCURRENCY_SCOPE=instance), every pod a rollout can run —
// maxReplicaCount plus the surge — would count.
func checkProviderBudget(t *testing.T, s *set, annotations map[string]string) {
	t.Helper()
	d := s.deployments["classifier"]
	c := d.Spec.Template.Spec.Containers[0]
	allowance, err := strconv.Atoi(annotations["assay.dev/provider-max-concurrency"])
	ceiling, err2 := strconv.Atoi(envValue(c, "ASSAY_MODEL_MAX_CONCURRENCY"))
	if err != nil || err2 != nil {
		t.Fatalf("%s: the provider's allowance and the cell's ceiling must both be set: %v, %v", s.dir, err, err2)
	}
	calls := ceiling
	if scope := envValue(c, "ASSAY_MODEL_CONCURRENCY_SCOPE"); scope != "" && scope != "cell" {
		calls = ceiling * podsAtMost(t, s, "classifier")
	}
	if calls > allowance {
		t.Errorf("%s: the classifiers may make %d calls at once, above the provider's %d", s.dir, calls, allowance)
	}
}

// podsAtMost is how many pods of a Deployment can run at once: its
// replicas (or its ScaledObject's maximum) plus the rolling update's surge.
func podsAtMost(t *testing.T, s *set, name string) int {
	t.Helper()
	d := s.deployments[name]
	n := 1
	if d.Spec.Replicas != nil {
		n = int(*d.Spec.Replicas)
	}
	if so := s.scaledObject[name]; so != nil && so.Spec.MaxReplicaCount != nil {
		n = int(*so.Spec.MaxReplicaCount)
	}
	surge := 1 // the API's default is 25 %, rounded up
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
		v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxSurge, n, true)
		if err != nil {
			t.Fatalf("%s: %s: maxSurge %v: %v", s.dir, name, ru.MaxSurge, err)
		}
		surge = v
	}
	return n + surge
}

// checkSurge: every pod a rollout can run at once, with its whole database
// pool (ASSAY_DATABASE_POOL, else the store's 10), and the migration Job's,
// fits the cell's Postgres max_connections beside the superuser's reserve.
func checkSurge(t *testing.T, s *set) {
	t.Helper()
	limit, err := maxConnections(s)
	if err != nil {
		t.Fatalf("%s: max_connections: %v", s.dir, err)
	}
	const reserved, defaultPool = 3, 10
	total := reserved + defaultPool // the migration Job
	for _, name := range services {
		pool := defaultPool
		if v := envValue(s.deployments[name].Spec.Template.Spec.Containers[0], "ASSAY_DATABASE_POOL"); v != "" {
			if pool, err = strconv.Atoi(v); err != nil {
				t.Fatalf("%s: %s: ASSAY_DATABASE_POOL %q", s.dir, name, v)
			}
		}
		if name == "ingress" {
			pool++ // the connection that listens for changes to tenants, out of the pool
		}
		total += podsAtMost(t, s, name) * pool
	}
	if total > limit {
		t.Errorf("%s: a rollout at the autoscalers' maximum may open %d Postgres connections, above max_connections %d", s.dir, total, limit)
	}
}

// maxConnections is the cell's Postgres max_connections: the CloudNativePG
// Cluster's parameter, else the -c max_connections=N of the single
// instance's command line, else Postgres's default, 100.
func maxConnections(s *set) (int, error) {
	if c := s.clusters["assay-pg"]; c != nil {
		return strconv.Atoi(c.Spec.PostgreSQL.Parameters["max_connections"])
	}
	if pg := s.statefulSets["assay-pg"]; pg != nil {
		args := pg.Spec.Template.Spec.Containers[0].Args
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, "max_connections="); ok && i > 0 && args[i-1] == "-c" {
				return strconv.Atoi(v)
			}
		}
		return 100, nil
	}
	return 0, fmt.Errorf("no Postgres rendered")
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func hasEnv(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func fmtInt64(p *int64) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatInt(*p, 10)
}
