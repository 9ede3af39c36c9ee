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

// readmeBlock is the shell block that follows marker in docs/operating.md.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), marker+"\n```sh\n")
	if !ok {
		t.Fatalf("docs/operating.md has no ```sh block after %s", marker)
	}
	block, _, ok := strings.Cut(after, "\n```")
	if !ok {
		t.Fatal("the docs/operating.md block does not end")
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

// walkthroughEnv is the environment a docs/operating.md block runs with: the test's
// own database and NATS (unless extra says otherwise), RUN, and the rest
// of the test's environment without its ASSAY_ settings.
func walkthroughEnv(t *testing.T, run string, extra ...string) []string {
	env := []string{"ASSAY_DATABASE_URL=" + freshDatabaseURL(t), "RUN=" + run}
	nats := true
	for _, kv := range extra {
		nats = nats && !strings.HasPrefix(kv, "ASSAY_NATS_URL=")
	}
	if nats {
		env = append(env, "ASSAY_NATS_URL="+testenv.NATS(t))
	}
	env = append(env, extra...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ASSAY_") && !strings.HasSuffix(strings.SplitN(kv, "=", 2)[0], "_ADDR") {
			env = append(env, kv)
		}
	}
	return env
}

// runBlock runs a docs/operating.md shell block under bash -euo pipefail in the
// clone, its output in run/block.out and block.err, and returns its error
// once it ends. Whatever it leaves running is killed when t ends.
func runBlock(t *testing.T, block, run string, env []string, limit time.Duration) error {
	t.Helper()
	g := &processGroup{cmd: exec.Command("bash", "-euo", "pipefail", "-c", block)}
	g.cmd.Dir, g.cmd.Env = repoRoot, env
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Files, not pipes: the services the block leaves running in the
	// background hold what they inherited, and Wait would wait for them.
	outFile, err := os.OpenFile(filepath.Join(run, "block.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	errFile, err := os.OpenFile(filepath.Join(run, "block.err"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	defer errFile.Close()
	g.cmd.Stdout, g.cmd.Stderr = outFile, errFile
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.signal(syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("the docs/operating.md block did not end in %s\n%s", limit, readLog(t, run, "block.err"))
		return nil
	}
}

// servingAddr is the address a process of the walkthrough logged it
// serves on.
func servingAddr(t *testing.T, run, name string) string {
	t.Helper()
	return loggedAddr(t, run, name, "serving")
}

// loggedAddr is the address of the first line of name's log whose message
// is msg: "serving" (the API's listener) or "serving metrics".
func loggedAddr(t *testing.T, run, name, msg string) string {
	t.Helper()
	for _, line := range strings.Split(readLog(t, run, name), "\n") {
		var l struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.Addr != "" {
			return l.Addr
		}
	}
	t.Fatalf("%s.log names no address it is %s on", name, msg)
	return ""
}

// docs/operating.md's walkthrough, run as written: make build's binaries,
// the database created by the migration, a tenant with its token in a
// file, the four services as four processes on free ports, readiness
// waited for, and a request that is accepted. Then what an operator reads:
// the usage report on the same base URL, JSON start-up logs with the
// version, migrations, streams and durables, the build-info metric, and
// its stop step, after which each service has drained and said
// how long it took.
func TestOperatorWalkthrough(t *testing.T) {
	block := readmeBlock(t, "<!-- operator-walkthrough -->")
	run := t.TempDir()
	env := walkthroughEnv(t, run)
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"sim", "ingress", "classifier", "committer", "ledger"} {
				b, _ := os.ReadFile(filepath.Join(run, f+".log"))
				t.Logf("%s.log:\n%s", f, b)
			}
		}
	})
	if err := runBlock(t, block, run, env, 8*time.Minute); err != nil {
		t.Fatalf("the docs/operating.md block failed: %v\n%s\nstdout: %s", err, readLog(t, run, "block.err"), readLog(t, run, "block.out"))
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
	base := "http://" + servingAddr(t, run, "ingress")
	if !strings.Contains(readLog(t, run, "block.out"), "ingress: "+base) {
		t.Errorf("the block did not say where ingress serves:\n%s", readLog(t, run, "block.out"))
	}
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
	if s := get("/metrics", &notFound); s != http.StatusNotFound {
		t.Errorf("/metrics on the API's address: HTTP %d, want 404: metrics have a listener of their own", s)
	}
	resp, err := http.Get("http://" + loggedAddr(t, run, "ingress", "serving metrics") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte(`assay_build_info{`)) || bytes.Contains(metrics, []byte(`revision=""`)) {
		t.Error("/metrics carries no assay_build_info, or one with an empty revision")
	}

	// The stop step of docs/operating.md: each service drains and says how long it
	// took.
	if err := runBlock(t, readmeBlock(t, "<!-- operator-walkthrough-stop -->"), run, env, time.Minute); err != nil {
		t.Fatalf("the stop block failed: %v\n%s", err, readLog(t, run, "block.err"))
	}
	services := []string{"ingress", "classifier", "committer", "ledger"}
	deadline = time.Now().Add(40 * time.Second)
	for _, svc := range services {
		for !strings.Contains(readLog(t, run, svc), `"msg":"stopped"`) {
			if time.Now().After(deadline) {
				t.Fatalf("%s logged no stop within 40s of the stop block", svc)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, svc := range services {
		log := readLog(t, run, svc)
		for _, want := range []string{`"msg":"starting"`, `"version":`, `"msg":"migrations"`, `"msg":"nats: connected"`,
			`"msg":"serving"`, `"msg":"draining`, `"took":`, `"stream_max_age":"168h0m0s"`, `"database_pool":10`} {
			if !strings.Contains(log, want) {
				t.Errorf("%s's log lacks %s", svc, want)
			}
		}
		for _, unwanted := range []string{`"revision":""`, `"msg":"nats: disconnected"`} {
			if strings.Contains(log, unwanted) {
				t.Errorf("%s's log has %s", svc, unwanted)
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

// The walkthrough block stops, within seconds and saying why, when a
// process cannot do its job: its port is taken (it never answers another
// program's ingress), NATS is not there, or NATS has no JetStream. No
// request is sent.
func TestOperatorWalkthroughStopsWithTheReason(t *testing.T) {
	block := readmeBlock(t, "<!-- operator-walkthrough -->")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	closed := freeAddr(t)
	plain := testenv.NATSWithoutJetStream(t)
	for _, c := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"port taken", []string{"INGRESS_ADDR=" + taken.Addr().String()}, []string{"ingress exited", "address already in use"}},
		{"no NATS", []string{"ASSAY_NATS_URL=nats://" + closed}, []string{"ingress exited", "ASSAY_NATS_URL", closed}},
		{"NATS without JetStream", []string{"ASSAY_NATS_URL=" + plain}, []string{"ingress exited", "JetStream is not enabled on " + plain}},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := t.TempDir()
			start := time.Now()
			err := runBlock(t, block, run, walkthroughEnv(t, run, c.extra...), 3*time.Minute)
			stderr := readLog(t, run, "block.err")
			if err == nil {
				t.Fatalf("the block succeeded:\n%s", readLog(t, run, "block.out"))
			}
			for _, want := range c.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("the block's error output lacks %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(readLog(t, run, "block.out"), "workId") {
				t.Errorf("a request was sent: %s", readLog(t, run, "block.out"))
			}
			t.Logf("stopped after %s", time.Since(start).Round(100*time.Millisecond))
		})
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
