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
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// cells are the region cells with an overlay each (as deploy/k8s's tests).
var cells = []string{"us", "eu"}

// TestManifestsOnARealAPIServer: every kustomization a cell is installed
// from — nats/<cell>, overlays/<cell>, overlays/<cell>/migrate — is
// accepted by kube-apiserver with the operators' CRDs loaded: a
// server-side apply with dry run and strict field validation, so a field
// the API (or a CRD's schema) does not know, a value its validation
// refuses, or a missing required field fails here.
func TestManifestsOnARealAPIServer(t *testing.T) {
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
	for _, cell := range cells {
		for _, dir := range []string{"nats/" + cell, "overlays/" + cell, "overlays/" + cell + "/migrate"} {
			n := 0
			for _, o := range render(t, dir) {
				if o.GetKind() == "Namespace" {
					// The namespace itself is made, so that what lives in it
					// can be dry-run there.
					apply(t, ctx, dyn, mapper, o, false)
				}
				apply(t, ctx, dyn, mapper, o, true)
				n++
			}
			t.Logf("%s: %d objects accepted (dry run, strict)", dir, n)
		}
	}
	// The check can fail: a misspelt field is refused.
	bad := render(t, "overlays/us")[0].DeepCopy()
	bad.Object["spec"].(map[string]any)["replicaz"] = 3
	if err := applyErr(ctx, dyn, mapper, bad, true); err == nil {
		t.Errorf("%s %s with a misspelt field was accepted", bad.GetKind(), bad.GetName())
	}
}

// render builds a kustomization of deploy/k8s as kubectl apply -k does.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func apply(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured, dryRun bool) {
	t.Helper()
	if err := applyErr(ctx, dyn, mapper, o, dryRun); err != nil {
		t.Errorf("%s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	}
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
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, b, opts)
	return err
}

// crdSources are the CRDs the manifests use, each read from its project's
// Go module at a pinned version (config/crd/bases, as the project
// publishes it): the module proxy serves them, checked against the
// checksum database, so nothing upstream is kept in this repository.
var crdSources = []struct{ module, file string }{
	{"github.com/cloudnative-pg/cloudnative-pg@v1.30.0", "postgresql.cnpg.io_clusters.yaml"},
	{"github.com/cloudnative-pg/cloudnative-pg@v1.30.0", "postgresql.cnpg.io_scheduledbackups.yaml"},
	{"github.com/cloudnative-pg/plugin-barman-cloud@v0.14.0", "barmancloud.cnpg.io_objectstores.yaml"},
	{"github.com/kedacore/keda/v2@v2.20.2", "keda.sh_scaledobjects.yaml"},
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
		f := filepath.Join(dirs[src.module], "config", "crd", "bases", src.file)
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
