package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/devkit/testenv"
)

// repoRoot is the clone this test runs in.
const repoRoot = "../.."

var (
	buildOnce sync.Once
	buildErr  error
)

// readmeBlock is the shell block that follows marker in README.md.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), marker+"\n```sh\n")
	if !ok {
		t.Fatalf("README.md has no ```sh block after %s", marker)
	}
	block, _, ok := strings.Cut(after, "\n```")
	if !ok {
		t.Fatal("the README block does not end")
	}
	return block
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// freshDatabaseURL names a database on the test server that does not exist
// yet (the walkthrough creates it), dropped when t ends.
func freshDatabaseURL(t *testing.T) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "assay_walk_" + hex.EncodeToString(b)
	u.Path = "/" + name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, base); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			conn.Close(ctx)
		}
	})
	return u.String()
}

// processGroup runs a command in its own process group, so everything it
// starts in the background can be signalled at once.
type processGroup struct {
	cmd *exec.Cmd
}

func (g *processGroup) signal(sig syscall.Signal) { _ = syscall.Kill(-g.cmd.Process.Pid, sig) }

// The README's operator section, run as written: make build's binaries,
// the database created by the migration, a tenant with its token in a
// file, the four services as four processes, readiness waited for, and a
// request that is accepted. Then what an operator reads: the usage report
// on the same base URL, JSON start-up logs with the version, migrations,
// streams and durables, the build-info metric, and a drain that says how
// long it took.
func TestOperatorWalkthrough(t *testing.T) {
	block := readmeBlock(t, "<!-- operator-walkthrough -->")
	run := t.TempDir()
	addrs := map[string]string{}
	for _, k := range []string{"SIM_ADDR", "INGRESS_ADDR", "CLASSIFIER_ADDR", "COMMITTER_ADDR", "LEDGER_ADDR"} {
		addrs[k] = freeAddr(t)
	}
	env := []string{"ASSAY_DATABASE_URL=" + freshDatabaseURL(t), "ASSAY_NATS_URL=" + testenv.NATS(t), "RUN=" + run}
	for k, v := range addrs {
		env = append(env, k+"="+v)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ASSAY_") {
			env = append(env, kv)
		}
	}
	g := &processGroup{cmd: exec.Command("bash", "-euo", "pipefail", "-c", block)}
	g.cmd.Dir, g.cmd.Env = repoRoot, env
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Files, not pipes: the services the block leaves running in the
	// background hold what they inherited, and Wait would wait for them.
	outFile, err := os.Create(filepath.Join(run, "block.out"))
	if err != nil {
		t.Fatal(err)
	}
	errFile, err := os.Create(filepath.Join(run, "block.err"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	defer errFile.Close()
	g.cmd.Stdout, g.cmd.Stderr = outFile, errFile
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.signal(syscall.SIGKILL)
		if t.Failed() {
			for _, f := range []string{"sim", "ingress", "classifier", "committer", "ledger"} {
				b, _ := os.ReadFile(filepath.Join(run, f+".log"))
				t.Logf("%s.log:\n%s", f, b)
			}
		}
	})
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the README block failed: %v\n%s\nstdout: %s", err, readLog(t, run, "block.err"), readLog(t, run, "block.out"))
		}
	case <-time.After(8 * time.Minute):
		t.Fatalf("the README block did not finish in 8 minutes\n%s", readLog(t, run, "block.err"))
	}
	// The block's last line is the answer to the request.
	lines := strings.Split(strings.TrimSpace(readLog(t, run, "block.out")), "\n")
	answer := lines[len(lines)-1]
	var sub struct {
		WorkID string `json:"workId"`
		State  string `json:"state"`
	}
	if err := json.Unmarshal([]byte(answer), &sub); err != nil || sub.WorkID == "" {
		t.Fatalf("the request's answer %q: %v", answer, err)
	}
	tok, err := os.ReadFile(filepath.Join(run, "acme.token"))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addrs["INGRESS_ADDR"]
	get := func(path string, v any) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil {
			_ = json.NewDecoder(resp.Body).Decode(v)
		}
		return resp.StatusCode
	}
	var view struct {
		State   string `json:"state"`
		Outcome string `json:"outcome"`
	}
	deadline := time.Now().Add(time.Minute)
	for get("/v1/work/"+sub.WorkID, &view); view.State != "accepted"; get("/v1/work/"+sub.WorkID, &view) {
		if time.Now().After(deadline) {
			t.Fatalf("work %s is %s after a minute, want accepted", sub.WorkID, view.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var rep struct {
		Calls int64 `json:"calls"`
	}
	deadline = time.Now().Add(30 * time.Second)
	for get("/v1/usage", &rep); rep.Calls < 1; get("/v1/usage", &rep) {
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/usage on the ingress address reports %d calls", rep.Calls)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var notFound struct {
		Error struct{ Code string } `json:"error"`
	}
	if s := get("/v1/nothing-here", &notFound); s != http.StatusNotFound || notFound.Error.Code != "not_found" {
		t.Errorf("an unknown path: HTTP %d, code %q; want a JSON 404", s, notFound.Error.Code)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte(`assay_build_info{`)) {
		t.Error("/metrics carries no assay_build_info")
	}

	// SIGTERM: each service drains and says how long it took.
	g.signal(syscall.SIGTERM)
	services := []string{"ingress", "classifier", "committer", "ledger"}
	deadline = time.Now().Add(40 * time.Second)
	for _, svc := range services {
		for !strings.Contains(readLog(t, run, svc), `"msg":"stopped"`) {
			if time.Now().After(deadline) {
				t.Fatalf("%s logged no stop within 40s of SIGTERM", svc)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, svc := range services {
		log := readLog(t, run, svc)
		for _, want := range []string{`"msg":"starting"`, `"version":`, `"msg":"migrations"`, `"msg":"nats: connected"`,
			`"msg":"serving"`, `"msg":"draining`, `"took":`} {
			if !strings.Contains(log, want) {
				t.Errorf("%s's log lacks %s", svc, want)
			}
		}
		for i, line := range strings.Split(strings.TrimSpace(log), "\n") {
			if !json.Valid([]byte(line)) {
				t.Errorf("%s.log line %d is not JSON: %s", svc, i+1, line)
			}
		}
	}
	for svc, want := range map[string]string{"ingress": `"msg":"stream ensured"`, "classifier": `"msg":"consumer ensured"`,
		"committer": `"msg":"consumer ensured"`, "ledger": `"msg":"consumer ensured"`} {
		if !strings.Contains(readLog(t, run, svc), want) {
			t.Errorf("%s's log lacks %s", svc, want)
		}
	}
	if strings.Contains(readLog(t, run, "ingress"), "postgres://postgres@") && !strings.Contains(readLog(t, run, "ingress"), "database_url") {
		t.Error("the database URL is logged outside the redacted configuration")
	}
}

func readLog(t *testing.T, dir, name string) string {
	t.Helper()
	if !strings.Contains(name, ".") {
		name += ".log"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
