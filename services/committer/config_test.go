package committer

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Bad GitHub App and publication settings stop start-up naming the
// variable; good ones load the key and the deadline.
func TestGitHubSettings(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "app.pem")
	if err := os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string // "" for no error
	}{
		{map[string]string{}, ""},
		{map[string]string{"ASSAY_GITHUB_APP_ID": "12", "ASSAY_GITHUB_APP_KEY_FILE": good}, ""},
		{map[string]string{"ASSAY_GITHUB_APP_ID": "12"}, "ASSAY_GITHUB_APP_KEY_FILE"},
		{map[string]string{"ASSAY_GITHUB_APP_KEY_FILE": good}, "ASSAY_GITHUB_APP_ID"},
		{map[string]string{"ASSAY_GITHUB_APP_ID": "twelve", "ASSAY_GITHUB_APP_KEY_FILE": good}, "ASSAY_GITHUB_APP_ID"},
		{map[string]string{"ASSAY_GITHUB_APP_ID": "12", "ASSAY_GITHUB_APP_KEY_FILE": junk}, "ASSAY_GITHUB_APP_KEY_FILE"},
		{map[string]string{"ASSAY_GITHUB_APP_ID": "12", "ASSAY_GITHUB_APP_KEY_FILE": filepath.Join(dir, "none")}, "ASSAY_GITHUB_APP_KEY_FILE"},
		{map[string]string{"ASSAY_GITHUB_API_URL": "api.github.com"}, "ASSAY_GITHUB_API_URL"},
		{map[string]string{"ASSAY_PUBLISH_DEADLINE": "6h"}, ""},
		{map[string]string{"ASSAY_PUBLISH_DEADLINE": "5s"}, "ASSAY_PUBLISH_DEADLINE"},
		{map[string]string{"ASSAY_PUBLISH_DEADLINE": "a day"}, "ASSAY_PUBLISH_DEADLINE"},
	} {
		var cfg Config
		err := cfg.FromEnv(func(k string) string { return c.env[k] })
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.env, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%v: error %v, want one naming %s", c.env, err, c.want)
		case c.want == "" && c.env["ASSAY_GITHUB_APP_ID"] != "" && (cfg.GitHubAppID != 12 || cfg.GitHubKey == nil):
			t.Errorf("%v: app %d, key %v", c.env, cfg.GitHubAppID, cfg.GitHubKey != nil)
		case c.want == "" && c.env["ASSAY_PUBLISH_DEADLINE"] != "" && cfg.PublishDeadline != 6*time.Hour:
			t.Errorf("%v: publication deadline %s", c.env, cfg.PublishDeadline)
		}
	}
}
