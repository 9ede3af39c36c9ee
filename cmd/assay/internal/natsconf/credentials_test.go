package natsconf

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// envLines reads NAME=value lines, skipping comments.
func envLines(t *testing.T, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("not a NAME=value line: %q", line)
		}
		out[k] = v
	}
	return out
}

// sourced is what a shell's environment holds after `set -a; . FILE; set
// +a`, as the README tells operators to load the file.
func sourced(t *testing.T, path string) map[string]string {
	t.Helper()
	cmd := exec.Command("sh", "-c", `set -a; . "$1"; set +a; env`, "sh", path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sourcing %s: %v", path, err)
	}
	return envLines(t, string(out))
}

var passwordShape = regexp.MustCompile(`^p[0-9a-f]{32}$`)

// The password file names every user's variable once, with a fresh value
// of the shape nats-server reads back as a string, and is private.
func TestPasswordFile(t *testing.T) {
	t.Parallel()
	cells := []string{"us", "eu", "ap-2"}
	creds, err := NewCredentials("staging-2", cells)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nats.env")
	if err := WriteSecrets(SecretFile{path, ServerEnv(creds)}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vars := envLines(t, string(text))
	users := append(append([]string(nil), Users...), RegionUsers...)
	if len(vars) != len(cells)*len(users) {
		t.Fatalf("%d variables, want %d", len(vars), len(cells)*len(users))
	}
	seen := map[string]bool{}
	for _, cell := range cells {
		for _, svc := range users {
			name := PasswordVar(namesOf("staging-2", cell), svc)
			v, ok := vars[name]
			if !ok {
				t.Fatalf("%s missing", name)
			}
			if !passwordShape.MatchString(v) {
				t.Fatalf("%s=%q: not p and 32 hex digits", name, v)
			}
			if seen[v] {
				t.Fatalf("%s: password drawn twice", name)
			}
			seen[v] = true
		}
	}
}

// WriteSecrets never overwrites, and a refused call leaves nothing of its
// own behind.
func TestWriteSecretsRefusesExisting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := filepath.Join(dir, "urls.env")
	if err := os.WriteFile(old, []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "nats.env")
	err := WriteSecrets(SecretFile{fresh, "A=p1\n"}, SecretFile{old, "B=p2\n"})
	if err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("err %v, want a refusal to overwrite", err)
	}
	if b, _ := os.ReadFile(old); string(b) != "kept\n" {
		t.Fatalf("existing file changed to %q", b)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left behind after the refusal: %v", fresh, err)
	}
}

// The trial as the README runs it: the password file loaded into the
// environment by a shell, nats-server on deploy/nats/assay.conf as shipped
// (only where it listens and stores set, as -p and -sd would), and a
// service connecting with its line of the service URLs file; a wrong
// password, or another user's, is refused.
func TestGeneratedPasswordsLogIn(t *testing.T) {
	dir := t.TempDir()
	creds, err := NewCredentials("assay", []string{"us", "eu"})
	if err != nil {
		t.Fatal(err)
	}
	envPath := filepath.Join(dir, "nats.env")
	if err := WriteSecrets(SecretFile{envPath, ServerEnv(creds)}); err != nil {
		t.Fatal(err)
	}
	env := sourced(t, envPath)
	for _, c := range creds {
		name := PasswordVar(c.Names, c.Service)
		if env[name] != c.Password {
			t.Fatalf("%s after sourcing is %q, want %q", name, env[name], c.Password)
		}
		t.Setenv(name, env[name])
	}

	ns := serve(t, "../../../../deploy/nats/assay.conf", 0)
	srv, err := ParseServer(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	urlsPath := filepath.Join(dir, "urls.env")
	if err := WriteSecrets(SecretFile{urlsPath, ServiceURLs(creds, srv)}); err != nil {
		t.Fatal(err)
	}
	urls := sourced(t, urlsPath)
	classifier := urls[URLVar(namesOf("assay", "us"), "classifier")]
	if classifier == "" {
		t.Fatalf("no ASSAY_US_CLASSIFIER_NATS_URL in\n%v", urls)
	}
	nc, err := nats.Connect(classifier, nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect as the US classifier: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	var ingressPW string
	for _, c := range creds {
		if c.User() == "assay-us-ingress" {
			ingressPW = c.Password
		}
	}
	for _, pw := range []string{"p0123456789abcdef0123456789abcdef", ingressPW} {
		bad := "nats://assay-us-classifier:" + pw + "@" + srv.Host
		nc, err := nats.Connect(bad, nats.NoReconnect())
		if err == nil {
			nc.Close()
			t.Fatal("connected with a wrong password")
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("wrong password: %v, want an authorization violation", err)
		}
	}
}

func TestParseServer(t *testing.T) {
	t.Parallel()
	for raw, ok := range map[string]bool{
		"nats://127.0.0.1:4222":   true,
		"tls://nats-us:4222":      true,
		"nats://nats-us:4222/":    true,
		"nats://u:p@nats-us:4222": false,
		"http://nats-us:4222":     false,
		"nats-us:4222":            false,
		"nats://nats-us:4222/x":   false,
		"nats://nats-us:4222?a=b": false,
		"":                        false,
	} {
		if _, err := ParseServer(raw); (err == nil) != ok {
			t.Errorf("ParseServer(%q): %v, want ok %v", raw, err, ok)
		}
	}
}

// serve starts nats-server from the configuration file at path, on a free
// port with a store of its own, until the test ends; users, when not 0, is
// how many users the file must define.
func serve(t *testing.T, path string, users int) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if users != 0 && len(opts.Users) != users {
		t.Fatalf("%s: %d users, want %d", path, len(opts.Users), users)
	}
	opts.Host, opts.Port, opts.StoreDir = "127.0.0.1", -1, filepath.Join(t.TempDir(), "store")
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready within 10s")
	}
	return ns
}
