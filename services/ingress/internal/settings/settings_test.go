package settings

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"assay.dev/services/ingress/internal/diffs"
)

// ASSAY_GITHUB_TOKEN is the single-tenant option: beside the App's
// credentials start-up stops, naming it; alone it reads every diff.
func TestGitHubTokenIsSingleTenantOnly(t *testing.T) {
	t.Parallel()
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	file := filepath.Join(t.TempDir(), "app.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"ASSAY_GITHUB_APP_ID": "9", "ASSAY_GITHUB_APP_KEY_FILE": file, "ASSAY_GITHUB_TOKEN": "ghp_one_persons"}
	var c Config
	if err := c.FromEnv(func(k string) string { return env[k] }); err == nil || !strings.HasPrefix(err.Error(), "ASSAY_GITHUB_TOKEN:") {
		t.Fatalf("App and static token: %v, want an error naming ASSAY_GITHUB_TOKEN", err)
	}
	delete(env, "ASSAY_GITHUB_TOKEN")
	c = Config{}
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil || c.GitHubAppID != 9 || c.GitHubKey == nil {
		t.Fatalf("App alone: %v, app %d", err, c.GitHubAppID)
	}
	c.Region = "us"
	if err := c.Defaults(); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Diffs.(*diffs.GitHubDiffs); !ok || d.App == nil || d.App.ID != 9 || d.Token != "" {
		t.Fatalf("diff source %+v, want the App's", c.Diffs)
	}
	both := Config{Region: "us", GitHubAppID: 9, GitHubKey: key, GitHubToken: "x"}
	if err := both.Defaults(); err == nil {
		t.Fatal("a Config with the App and a static token was taken")
	}
}

func TestConfigRefusesBadGitHubAPI(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"api.github.com", "ftp://x", "https://"} {
		c := Config{Region: "us", GitHubAPI: api}
		if err := c.Defaults(); err == nil {
			t.Errorf("GitHubAPI %q accepted", api)
		}
	}
}
