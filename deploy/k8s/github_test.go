package k8s

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/yaml"
)

// githubApp is the optional component that gives the cell's services the
// GitHub App.
const githubApp = "components/github-app"

// renderWithGitHubApp renders a cell's overlay with the component
// github-app added as its kustomization.yaml says, and decodes its
// Deployments and ConfigMaps strictly.
func renderWithGitHubApp(t *testing.T, cell string) *set {
	t.Helper()
	mem := memTree(t)
	edit(t, mem, "/k8s/"+cellDir(cell)+"/kustomization.yaml", "components:\n  - cell\n", "components:\n  - cell\n  - ../../"+githubApp+"\n")
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/k8s/"+cellDir(cell))
	if err != nil {
		t.Fatalf("%s with %s: %v", cell, githubApp, err)
	}
	s := &set{dir: cellDir(cell), deployments: map[string]*appsv1.Deployment{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, o := range objects(t, m) {
		switch o.Kind {
		case "Deployment":
			err = into(o, s.deployments)
		case "ConfigMap":
			err = into(o, s.configMaps)
		}
		if err != nil {
			t.Fatalf("%s: %s %s: %v", cell, o.Kind, o.Name, err)
		}
	}
	return s
}

// appSettings are the GitHub App's settings a service takes from the
// manifests: its id, the file of its private key and its webhook secret.
var appSettings = []string{"ASSAY_GITHUB_APP_ID", "ASSAY_GITHUB_APP_KEY_FILE", "ASSAY_GITHUB_WEBHOOK_SECRET"}

// TestGitHubAppSettings: each service's GitHub settings in the manifests
// are the ones its binary reads (its --help): no service sets a GitHub
// setting its binary does not read, with or without the component
// github-app; with it, the App's id, key file and webhook secret are set on
// exactly the services that read them (ingress and the committer; the
// classifier and the ledger read none), the id from the Secret
// assay-github, the key file a mounted key of it, and ingress's
// single-tenant token, which it refuses beside an App, gone; without it,
// no service has half an App. The example Secret holds exactly the keys
// the manifests read, each value a marked placeholder.
func TestGitHubAppSettings(t *testing.T) {
	help := map[string]map[string]bool{}
	for _, name := range services {
		help[name] = helpVars(t, name)
	}
	read := map[string]bool{} // the keys of assay-github the manifests read
	for _, cell := range cellIDs {
		plain := load(t, cellDir(cell))
		app := renderWithGitHubApp(t, cell)
		for _, name := range services {
			for variant, s := range map[string]*set{"without the App": plain, "with the App": app} {
				p := s.deployments[name].Spec.Template.Spec
				c := p.Containers[0]
				for _, e := range c.Env {
					if strings.HasPrefix(e.Name, "ASSAY_GITHUB_") && !help[name][e.Name] {
						t.Errorf("%s %s: %s sets %s, which its binary does not read", cell, variant, name, e.Name)
					}
					if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name == "assay-github" {
						read[r.SecretKeyRef.Key] = true
					}
				}
				for _, v := range p.Volumes {
					if v.Secret != nil && v.Secret.SecretName == "assay-github" {
						for _, it := range v.Secret.Items {
							read[it.Key] = true
						}
					}
				}
			}
			c := app.deployments[name].Spec.Template.Spec.Containers[0]
			for _, v := range appSettings {
				if hasEnv(c, v) != help[name][v] {
					t.Errorf("%s with the App: %s sets %s: %v; its binary reads it: %v", cell, name, v, hasEnv(c, v), help[name][v])
				}
			}
			if hasEnv(c, "ASSAY_GITHUB_APP_ID") && hasEnv(c, "ASSAY_GITHUB_TOKEN") {
				t.Errorf("%s with the App: %s sets ASSAY_GITHUB_TOKEN beside the App, which stops it", cell, name)
			}
			pc := plain.deployments[name].Spec.Template.Spec.Containers[0]
			if hasEnv(pc, "ASSAY_GITHUB_APP_ID") || hasEnv(pc, "ASSAY_GITHUB_APP_KEY_FILE") {
				t.Errorf("%s without the App: %s sets the App's id or key", cell, name)
			}
			if !hasEnv(c, "ASSAY_GITHUB_APP_ID") {
				continue
			}
			id := c.Env[slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "ASSAY_GITHUB_APP_ID" })]
			if id.ValueFrom == nil || id.ValueFrom.SecretKeyRef == nil || id.ValueFrom.SecretKeyRef.Name != "assay-github" ||
				(id.ValueFrom.SecretKeyRef.Optional != nil && *id.ValueFrom.SecretKeyRef.Optional) {
				t.Errorf("%s: %s: ASSAY_GITHUB_APP_ID is not a required key of the Secret assay-github", cell, name)
			}
			file := envValue(c, "ASSAY_GITHUB_APP_KEY_FILE")
			vol := mountOf(c, app.deployments[name].Spec.Template.Spec, filepath.Dir(file))
			if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "assay-github" || (vol.Secret.Optional != nil && *vol.Secret.Optional) ||
				!slices.ContainsFunc(vol.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == filepath.Base(file) }) {
				t.Errorf("%s: %s: ASSAY_GITHUB_APP_KEY_FILE %q is not a key of the Secret assay-github, mounted", cell, name, file)
			}
		}
	}
	for _, name := range []string{"classifier", "ledger"} {
		for v := range help[name] {
			if strings.HasPrefix(v, "ASSAY_GITHUB_") {
				t.Errorf("%s reads %s: the component gives it nothing", name, v)
			}
		}
	}
	var example corev1.Secret
	b, err := os.ReadFile(githubApp + "/secret.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yamlStrict(b, &example); err != nil {
		t.Fatalf("%s/secret.example.yaml: %v", githubApp, err)
	}
	delete(read, "token") // ingress's, without an App
	if got, want := keys(example.StringData), keys(read); example.Name != "assay-github" || !slices.Equal(got, want) {
		t.Errorf("%s/secret.example.yaml: Secret %s with %v, want assay-github with %v", githubApp, example.Name, got, want)
	}
	for k, v := range example.StringData {
		if !strings.Contains(v, "REPLACE-ME") {
			t.Errorf("%s/secret.example.yaml: %s is not marked a placeholder (REPLACE-ME)", githubApp, k)
		}
		if !slices.Contains(secrets["assay-github"], k) {
			t.Errorf("%s/secret.example.yaml: %s is not a listed key of assay-github", githubApp, k)
		}
	}
	var component struct{ Resources, Components []string }
	if b, err := os.ReadFile(githubApp + "/kustomization.yaml"); err != nil || jsonLoose(mustYAMLToJSON(t, b), &component) != nil ||
		slices.Contains(component.Resources, "secret.example.yaml") {
		t.Errorf("%s applies its example Secret (%v, resources %v)", githubApp, err, component.Resources)
	}
}

// TestGitHubAppStarts: the binaries take the App's settings as the
// component gives them: ingress and the committer, with their
// Deployment's environment (a real App id, a PEM key at the mounted
// path), get past their settings to connecting (exit 1, Postgres absent,
// after the "starting" line), and stop at their settings (exit 2, naming
// ASSAY_GITHUB_APP_ID) on the example Secret's placeholders.
func TestGitHubAppStarts(t *testing.T) {
	s := renderWithGitHubApp(t, "us")
	var example corev1.Secret
	b, err := os.ReadFile(githubApp + "/secret.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yamlStrict(b, &example); err != nil {
		t.Fatal(err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	real := map[string]string{"app-id": "123456", "webhook-secret": "test-webhook-secret",
		"private-key.pem": string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))}
	for _, name := range []string{"ingress", "committer"} {
		for what, github := range map[string]map[string]string{"the App's": real, "the example's placeholders": example.StringData} {
			p := s.deployments[name].Spec.Template.Spec
			c := p.Containers[0]
			dir := t.TempDir()
			env := []string{"ASSAY_STARTUP_WAIT=0", "HOME=" + dir}
			for _, e := range c.Env {
				v := e.Value
				switch {
				case e.Name == "ASSAY_HTTP_ADDR" || e.Name == "ASSAY_METRICS_ADDR":
					v = "127.0.0.1:0"
				case e.Name == "SSL_CERT_DIR" || e.Name == "PGSSLROOTCERT":
					continue
				case e.Name == "PGSSLMODE":
					v = "disable"
				case e.Name == "ASSAY_GITHUB_APP_KEY_FILE":
					v = filepath.Join(dir, filepath.Base(e.Value))
					if err := os.WriteFile(v, []byte(github["private-key.pem"]), 0o600); err != nil {
						t.Fatal(err)
					}
				case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
					v = s.configMaps[e.ValueFrom.ConfigMapKeyRef.Name].Data[e.ValueFrom.ConfigMapKeyRef.Key]
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
					r := e.ValueFrom.SecretKeyRef
					switch r.Name {
					case "assay-github":
						v = github[r.Key]
					case "assay-pg-app":
						v = "postgres://assay@127.0.0.1:1/assay"
					case "assay-nats-urls":
						v = "nats://127.0.0.1:1"
					default:
						v = "test"
					}
				}
				env = append(env, e.Name+"="+v)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			cmd := exec.CommandContext(ctx, binary(t, name))
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			cancel()
			var exit *exec.ExitError
			code := -1
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			}
			if what == "the App's" && (code != 1 || !strings.Contains(string(out), `"msg":"starting"`)) {
				t.Errorf("%s with %s settings: exit %d, want 1 after the \"starting\" line (settings taken, Postgres absent):\n%s", name, what, code, out)
			}
			if what != "the App's" && (code != 2 || !strings.Contains(string(out), "ASSAY_GITHUB_APP_ID")) {
				t.Errorf("%s with %s: exit %d, want 2 naming ASSAY_GITHUB_APP_ID:\n%s", name, what, code, out)
			}
		}
	}
}

func mustYAMLToJSON(t *testing.T, b []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
