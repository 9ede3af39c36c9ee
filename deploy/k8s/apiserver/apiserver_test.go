package apiserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	ktypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// optionalComponents are the components that no kustomization includes,
// each with where it goes, as its kustomization.yaml tells an operator:
// "overlays", on top of a cell's overlay (overlays/<cell>), or "nats", on
// top of a region's NATS kustomization (nats/<region>, the one that holds
// the namespace). A component included by no kustomization and missing
// here fails the check: a new one cannot go unchecked.
var optionalComponents = map[string]string{
	"components/monitoring":    "overlays",
	"components/api-ingress":   "overlays",
	"components/api-httproute": "overlays",
	"components/github-app":    "overlays",
	"components/cert-manager":  "nats",
}

// check is one kustomization to apply: a directory of deploy/k8s, with
// the optional component added to its components, if any; or an example
// manifest that no kustomization applies (a file named *.example.yaml),
// as kubectl apply -f would.
type check struct {
	dir, component string
	example        bool
}

func (c check) String() string {
	if c.component == "" {
		return c.dir
	}
	return c.dir + " + " + c.component
}

// TestManifestsOnARealAPIServer: every kustomization under deploy/k8s —
// each directory holding a kustomization file, found by walking the tree —
// and every optional component on top of each kustomization it is for, is
// accepted by kube-apiserver with the operators' CRDs loaded: a
// server-side apply with dry run and strict field validation, so a field
// the API (or a CRD's schema) does not know, a value its validation
// refuses, or a missing required field fails here. The namespaces the
// kustomizations make are made first, for real; what names no namespace
// goes to default, as kubectl apply -k puts it. One line per
// kustomization says ok or FAIL.
func TestManifestsOnARealAPIServer(t *testing.T) {
	begin := time.Now()
	checks := discover(t)
	tree := memTree(t)
	rendered := map[check][]*unstructured.Unstructured{}
	renderErr := map[check]error{}
	for _, c := range checks {
		rendered[c], renderErr[c] = renderCheck(tree, c)
	}
	ctx := t.Context()
	cfg := startAPIServer(t)
	loadCRDs(t, ctx, cfg)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	// The namespaces themselves are made, so that what lives in them can be
	// dry-run there.
	for _, c := range checks {
		for _, o := range rendered[c] {
			if o.GetKind() == "Namespace" {
				if err := applyErr(ctx, dyn, mapper, o, false); err != nil {
					t.Errorf("%s: Namespace %s: %v", c, o.GetName(), err)
				}
			}
		}
	}
	var report []string
	failed := 0
	for _, c := range checks {
		if err := renderErr[c]; err != nil {
			t.Errorf("kustomize build %s: %v", c, err)
			report = append(report, fmt.Sprintf("FAIL  %-58s kustomize build: %v", c, err))
			failed++
			continue
		}
		refused := 0
		for _, o := range rendered[c] {
			if err := applyErr(ctx, dyn, mapper, o, true); err != nil {
				t.Errorf("%s: %s %s/%s: %v", c, o.GetKind(), o.GetNamespace(), o.GetName(), err)
				refused++
			}
		}
		verdict := "ok  "
		if refused > 0 {
			verdict = "FAIL"
			failed++
		}
		report = append(report, fmt.Sprintf("%s  %-58s %3d objects, %d refused (dry run, strict)", verdict, c, len(rendered[c]), refused))
	}
	// The check can fail: a misspelt field is refused.
	bad := rendered[check{dir: "overlays/us"}][0].DeepCopy()
	bad.Object["spec"].(map[string]any)["replicaz"] = 3
	if err := applyErr(ctx, dyn, mapper, bad, true); err == nil {
		t.Errorf("%s %s with a misspelt field was accepted", bad.GetKind(), bad.GetName())
	}
	t.Logf("%d checks (kustomizations, optional components on top of them, examples), %d failed, in %s:\n%s", len(checks), failed, time.Since(begin).Round(time.Second), strings.Join(report, "\n"))
}

// kustomizationFiles are the names kustomize reads a kustomization from.
var kustomizationFiles = []string{"kustomization.yaml", "kustomization.yml", "Kustomization"}

// discover walks deploy/k8s (this module aside) for every directory with a
// kustomization file: each Kustomization is a check of its own, each
// Component is covered by the kustomizations that include it, and one
// that none includes is a check on top of every kustomization
// optionalComponents says it goes on. Each example manifest
// (*.example.yaml) is a check too.
func discover(t *testing.T) []check {
	t.Helper()
	var kusts, comps, examples []string
	included := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == filepath.Join("..", "apiserver") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".example.yaml") {
			rel, _ := filepath.Rel("..", path)
			examples = append(examples, rel)
		}
		if d.IsDir() || !slices.Contains(kustomizationFiles, d.Name()) {
			return nil
		}
		dir, _ := filepath.Rel("..", filepath.Dir(path))
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var k ktypes.Kustomization
		if err := yaml.Unmarshal(b, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if k.Kind == ktypes.ComponentKind {
			comps = append(comps, dir)
		} else {
			kusts = append(kusts, dir)
		}
		for _, c := range k.Components {
			included[filepath.Join(dir, c)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(kusts) == 0 || !slices.Contains(kusts, "overlays/us") {
		t.Fatalf("found the kustomizations %v: not deploy/k8s", kusts)
	}
	var checks []check
	for _, k := range kusts {
		checks = append(checks, check{dir: k})
	}
	for _, c := range comps {
		if included[c] {
			continue
		}
		where, ok := optionalComponents[c]
		if !ok {
			t.Errorf("the component %s is included by no kustomization, and this check does not know where it goes (optionalComponents)", c)
			continue
		}
		n := 0
		for _, k := range kusts {
			if parent, _, nested := strings.Cut(k, "/"); parent != where || strings.Contains(strings.TrimPrefix(k, where+"/"), "/") || !nested {
				continue
			}
			if where == "nats" && !rendersNamespace(t, k) {
				continue // nats/policies, nats/single: no region's namespace
			}
			checks = append(checks, check{dir: k, component: c})
			n++
		}
		if n == 0 {
			t.Errorf("the component %s goes on top of %s/<name>, and there is none", c, where)
		}
	}
	for _, e := range examples {
		checks = append(checks, check{dir: e, example: true})
	}
	for c := range optionalComponents {
		if !slices.Contains(comps, c) {
			t.Errorf("optionalComponents names %s, which is not a component of deploy/k8s", c)
		}
	}
	slices.SortFunc(checks, func(a, b check) int { return strings.Compare(a.String(), b.String()) })
	return checks
}

// rendersNamespace says whether the kustomization in dir holds a Namespace.
func rendersNamespace(t *testing.T, dir string) bool {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", dir))
	if err != nil {
		return false
	}
	for _, r := range m.Resources() {
		if r.GetKind() == "Namespace" {
			return true
		}
	}
	return false
}

// memTree is a copy of deploy/k8s (this module aside) in memory, under
// /k8s, where a check adds a component to a kustomization.
func memTree(t *testing.T) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == filepath.Join("..", "apiserver") {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		return mem.WriteFile(filepath.Join("/k8s", rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// renderCheck builds c as kubectl apply -k does: its kustomization, with
// the component added after its own components, as an operator adds it.
func renderCheck(tree filesys.FileSystem, c check) ([]*unstructured.Unstructured, error) {
	if c.example {
		b, err := os.ReadFile(filepath.Join("..", c.dir))
		if err != nil {
			return nil, err
		}
		var out []*unstructured.Unstructured
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				return out, nil
			} else if err != nil {
				return nil, err
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	fsys := filesys.MakeFsOnDisk()
	dir := filepath.Join("..", c.dir)
	if c.component != "" {
		fsys, dir = tree, filepath.Join("/k8s", c.dir)
		path := filepath.Join(dir, "kustomization.yaml")
		b, err := tree.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var k ktypes.Kustomization
		if err := yaml.Unmarshal(b, &k); err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(c.dir, c.component)
		if err != nil {
			return nil, err
		}
		k.Components = append(k.Components, rel)
		if b, err = yaml.Marshal(k); err != nil {
			return nil, err
		}
		// A copy of the tree per check: another check's component is not
		// there.
		copied := filesys.MakeFsInMemory()
		if err := tree.Walk("/k8s", func(p string, info fs.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			content, err := tree.ReadFile(p)
			if err != nil {
				return err
			}
			return copied.WriteFile(p, content)
		}); err != nil {
			return nil, err
		}
		if err := copied.WriteFile(path, b); err != nil {
			return nil, err
		}
		fsys = copied
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func applyErr(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured, dryRun bool) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		mapper.Reset()
		if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("the API does not serve it: %w", err)
		}
	}
	b, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "assay-check", FieldValidation: "Strict", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		// A kustomization that names no namespace is applied to the
		// context's, default here.
		ns := o.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		ri = dyn.Resource(m.Resource).Namespace(ns)
	}
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, b, opts)
	return err
}

// crdSources are the CRDs the manifests use, the optional components'
// included, each read from its project's Go module at a pinned version
// (the file as the project publishes it): the module proxy serves them,
// checked against the checksum database, so nothing upstream is kept in
// this repository. prometheus-operator's is 0.85.0, the newest version of
// its root module the proxy serves (its API module, which deploy/k8s's
// tests decode with, is 0.95.2).
var crdSources = []struct{ module, file string }{
	{"github.com/cloudnative-pg/cloudnative-pg@v1.30.0", "config/crd/bases/postgresql.cnpg.io_clusters.yaml"},
	{"github.com/cloudnative-pg/cloudnative-pg@v1.30.0", "config/crd/bases/postgresql.cnpg.io_scheduledbackups.yaml"},
	{"github.com/cloudnative-pg/plugin-barman-cloud@v0.14.0", "config/crd/bases/barmancloud.cnpg.io_objectstores.yaml"},
	{"github.com/kedacore/keda/v2@v2.20.2", "config/crd/bases/keda.sh_scaledobjects.yaml"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"},
	{"github.com/prometheus-operator/prometheus-operator@v0.85.0", "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"},
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds/cert-manager.io_certificates.yaml"},
	{"github.com/cert-manager/cert-manager@v1.21.2", "deploy/crds/cert-manager.io_issuers.yaml"},
	{"sigs.k8s.io/gateway-api@v1.6.3", "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"},
}

// moduleDir downloads one module version into the module cache and says
// where it is.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module)
	// Outside this module, so its go.mod and go.sum are not touched.
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, err := cmd.Output()
	var got struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &got); err != nil || jerr != nil || got.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", module, err, got.Error)
	}
	return got.Dir
}

// loadCRDs creates every CRD of crdSources and waits until each is served.
func loadCRDs(t *testing.T, ctx context.Context, cfg *rest.Config) {
	t.Helper()
	cs, err := apiextensions.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, src := range crdSources {
		if dirs[src.module] == "" {
			dirs[src.module] = moduleDir(t, src.module)
		}
		f := filepath.Join(dirs[src.module], filepath.FromSlash(src.file))
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := dec.Decode(&crd); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if crd.Name == "" {
				continue
			}
			if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			waitEstablished(t, ctx, cs, crd.Name)
		}
	}
}

func waitEstablished(t *testing.T, ctx context.Context, cs apiextensions.Interface, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established within a minute (%v)", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startAPIServer builds kube-apiserver from this module's k8s.io/kubernetes,
// starts Debian's etcd and kube-apiserver on free loopback ports, and
// returns a client configuration for a static admin token.
func startAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd is not installed: this check needs Debian's etcd-server (apt-get install etcd-server)")
	}
	bin := buildAPIServer(t)
	dir := t.TempDir()
	ports := freePorts(t, 3)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	start(t, dir, "etcd", etcd, "--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", etcdURL,
		"--advertise-client-urls", etcdURL, "--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[1]),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(ports[1]))
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	for name, b := range map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(token + ",admin,admin,system:masters\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := ports[2]
	start(t, dir, "kube-apiserver", bin, "--etcd-servers", etcdURL, "--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port), "--cert-dir", filepath.Join(dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"), "--service-cluster-ip-range", "10.0.0.0/24",
		"--authorization-mode", "RBAC", "--token-auth-file", filepath.Join(dir, "tokens.csv"))
	cfg := &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(port), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400}
	waitReady(t, cfg)
	return cfg
}

// buildAPIServer builds kube-apiserver from this module into the user's
// cache (go's build cache makes a second build quick), or takes the binary
// KUBE_APISERVER names, built from the same source elsewhere.
func buildAPIServer(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		// A plain go build stamps no version (v0.0.0-master): this says
		// only that it is a kube-apiserver.
		out, err := exec.Command(p, "--version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "Kubernetes v") {
			t.Fatalf("KUBE_APISERVER=%s: %v %s: not a kube-apiserver", p, err, out)
		}
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	out := filepath.Join(cache, "assay-k8s-apiserver", "kube-apiserver")
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", out, "k8s.io/kubernetes/cmd/kube-apiserver")
	// This module is no part of the repository's workspace (it would pull
	// Kubernetes into every other module's build list).
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build k8s.io/kubernetes/cmd/kube-apiserver: %v\n%s", err, msg)
	}
	t.Logf("kube-apiserver built in %s", time.Since(start).Round(time.Second))
	return out
}

// start runs a process until the test ends, its output in dir/<name>.log,
// shown when the test fails.
func start(t *testing.T, dir, name, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (end):\n%s", name, b)
		}
	})
}

func waitReady(t *testing.T, cfg *rest.Config) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: insecureTLS()}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready within two minutes: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// insecureTLS trusts the apiserver's self-signed certificate: the server
// is this test's own, on loopback.
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }
