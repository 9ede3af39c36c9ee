package main

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"assay.dev/cmd/assay/internal/natsconf"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
)

// buildBinaries runs make build, as an operator would, once per test
// binary, and returns bin/.
func buildBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("make", "-C", repoRoot, "build").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("make build: %v", buildErr)
	}
	bin, err := filepath.Abs(filepath.Join(repoRoot, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// A service started with another service's NATS user fails at start and
// says the server refused the credential, instead of looking healthy.
func TestAnotherServicesCredentialStopsStartup(t *testing.T) {
	bin := buildBinaries(t)
	creds, err := natsconf.NewCredentials("assay", config.DefaultRegions)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range creds {
		t.Setenv(natsconf.PasswordVar(c.Names, c.Service), c.Password)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(repoRoot, "deploy/nats/assay.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port, opts.StoreDir, opts.NoSigs, opts.NoLog = "127.0.0.1", -1, t.TempDir(), true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	host, _ := url.Parse(ns.ClientURL())
	var classifier natsconf.Credential
	for _, c := range creds {
		if c.Names.Cell == "us" && c.Service == "classifier" {
			classifier = c
		}
	}
	wrong := (&url.URL{Scheme: "nats", User: url.UserPassword(classifier.User(), classifier.Password), Host: host.Host}).String()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "ingress"))
	cmd.Env = append(os.Environ(), "ASSAY_REGION=us", "ASSAY_DATABASE_URL="+testenv.Database(t), "ASSAY_NATS_URL="+wrong,
		"ASSAY_HTTP_ADDR=127.0.0.1:0", "ASSAY_METRICS_ADDR=127.0.0.1:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("ingress with the classifier's user: %v, want exit 1\n%s", err, stderr.String())
	}
	out := stderr.String()
	if !strings.Contains(out, "refused this credential") || !strings.Contains(strings.ToLower(out), "permissions violation") {
		t.Fatalf("the failure does not name the refused credential:\n%s", out)
	}
	if strings.Contains(out, classifier.Password) {
		t.Fatal("the failure prints the password")
	}
	if !strings.Contains(out, `"msg":"nats: asynchronous error"`) {
		t.Errorf("the server's refusal is not a JSON log line:\n%s", out)
	}
	// A refused credential is a bad setting no retry mends: the start
	// gives up at the first refusal instead of asking again until its
	// deadline (a refusal every 2 s for 30 s before).
	if n := strings.Count(out, `"msg":"nats: asynchronous error"`); n > 2 {
		t.Errorf("the server refused the start %d times: it went on asking after the first refusal\n%s", n, out)
	}
}

// Every binary: --help exits 0 and lists its own settings (the model's only
// for the classifier), --version exits 0, and a bad setting of its own
// exits 2 naming it, before anything is connected.
func TestBinariesHelpVersionAndBadSettings(t *testing.T) {
	bin := buildBinaries(t)
	base := []string{"ASSAY_REGION=us", "ASSAY_DATABASE_URL=postgres://postgres@127.0.0.1:1/none", "ASSAY_MODEL_BASE_URL=http://127.0.0.1:1", "ASSAY_MODEL=m"}
	runBin := func(name string, env []string, args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH")}, base...), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	cases := []struct {
		name, own, bad string
		model          bool
	}{
		{"ingress", "ASSAY_SWEEP_QUEUED_FOR", "ASSAY_SWEEP_EVERY=often", false},
		{"classifier", "ASSAY_CALL_TIMEOUT", "ASSAY_MAX_ATTEMPTS=0", true},
		{"committer", "ASSAY_COMMITTER_REAP_GRACE", "ASSAY_ACK_WAIT=soon", false},
		{"ledger", "ASSAY_LEDGER_REAP_GRACE", "ASSAY_PRICE_TABLE=/no/such/prices.json", false},
	}
	for _, c := range cases {
		code, out, _ := runBin(c.name, nil, "--help")
		if code != 0 || !strings.Contains(out, c.own) || !strings.Contains(out, "ASSAY_DATABASE_URL") ||
			strings.Contains(out, "ASSAY_MODEL_BASE_URL") != c.model {
			t.Errorf("%s --help: exit %d\n%s", c.name, code, out)
		}
		if code, out, _ := runBin(c.name, nil, "--version"); code != 0 || !strings.HasPrefix(out, c.name+" ") {
			t.Errorf("%s --version: exit %d %q", c.name, code, out)
		}
		setting, _, _ := strings.Cut(c.bad, "=")
		if code, _, errOut := runBin(c.name, []string{c.bad}); code != 2 || !strings.Contains(errOut, setting) {
			t.Errorf("%s with %s: exit %d %q, want 2 naming it", c.name, c.bad, code, errOut)
		}
	}
	for _, args := range [][]string{{"--help"}, {"tenant", "-h"}, {"tenants", "seed", "-h"}, {"migrate", "--help"}, {"version"}, {"nats-config", "-h"}, {"operator", "--help"}, {"operator", "token", "-h"}} {
		if code, out, errOut := runBin("assay", nil, args...); code != 0 || out == "" {
			t.Errorf("assay %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}
