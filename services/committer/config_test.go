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
		{map[string]string{"ASSAY_PUBLISH_CONCURRENCY": "8", "ASSAY_CALLBACK_CONCURRENCY": "3",
			"ASSAY_GITHUB_WRITES_PER_MINUTE": "40", "ASSAY_GITHUB_WRITES_PER_HOUR": "400"}, ""},
		{map[string]string{"ASSAY_PUBLISH_CONCURRENCY": "0"}, "ASSAY_PUBLISH_CONCURRENCY"},
		{map[string]string{"ASSAY_CALLBACK_CONCURRENCY": "many"}, "ASSAY_CALLBACK_CONCURRENCY"},
		{map[string]string{"ASSAY_GITHUB_WRITES_PER_MINUTE": "-1"}, "ASSAY_GITHUB_WRITES_PER_MINUTE"},
		{map[string]string{"ASSAY_GITHUB_WRITES_PER_MINUTE": "90", "ASSAY_GITHUB_WRITES_PER_HOUR": "60"}, "ASSAY_GITHUB_WRITES_PER_MINUTE"},
		{map[string]string{"ASSAY_GITHUB_BUDGET_NATS_URL": "http://nats:4222"}, "ASSAY_GITHUB_BUDGET_NATS_URL"},
		{map[string]string{"ASSAY_GITHUB_BUDGET_NATS_URL": "nats://publisher:pw@nats:4222"}, ""},
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
		case c.want == "" && c.env["ASSAY_PUBLISH_CONCURRENCY"] != "" && (cfg.PublishConcurrency != 8 || cfg.CallbackConcurrency != 3 ||
			cfg.GitHubWritesPerMinute != 40 || cfg.GitHubWritesPerHour != 400):
			t.Errorf("%v: concurrency %d and %d, writes %d a minute and %d an hour", c.env, cfg.PublishConcurrency,
				cfg.CallbackConcurrency, cfg.GitHubWritesPerMinute, cfg.GitHubWritesPerHour)
		case c.want == "" && c.env["ASSAY_GITHUB_BUDGET_NATS_URL"] != "" && cfg.GitHubBudgetNATSURL != c.env["ASSAY_GITHUB_BUDGET_NATS_URL"]:
			t.Errorf("%v: budget URL %q", c.env, cfg.GitHubBudgetNATSURL)
		}
	}
}
