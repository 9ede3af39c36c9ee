package main

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/devkit/testenv"
)

// notExported are the variables assay's commands read that assay-dev dev
// --serve's export line leaves out, and why.
var notExported = map[string]string{
	"ASSAY_HTTP_ADDR":             "assay-dev sim's own listen address: it reaches no cell",
	"ASSAY_PUBLISH_DEADLINE":      "assay publish retry's fresh deadline, a choice with a default",
	"ASSAY_PLACEMENT_NATS_URL":    "the region's account; unset, the placement map is the cell's own, which ASSAY_NATS_URL reaches, as in assay-dev dev",
	"ASSAY_CELLS":                 "rollout --all-cells's cells; unset, a cell per region of ASSAY_REGIONS, which the line exports: assay-dev dev's cells exactly",
	"ASSAY_GITHUB_WEBHOOK_SECRET": "assay-dev dev webhook's override of the secret serve keeps",
	"ASSAY_GITHUB_API_URL":        "assay-dev dev --serve's choice of the user's GitHub over the fake one",
	"ASSAY_GITHUB_APP_ID":         "the same",
	"ASSAY_GITHUB_APP_KEY_FILE":   "the same",
	"ASSAY_GITHUB_TOKEN":          "the same",
}

// The export line assay-dev dev --serve prints names exactly the variables
// assay's commands read (found in the source of assay, .., and of this
// package: os.Getenv and envOr of a name, every name a pass-through getenv
// such as operatorEnv answers, and the required settings of config.Load
// when it is handed os.Getenv), less those notExported says why it leaves
// out.
func TestServeExportsWhatTheCommandsRead(t *testing.T) {
	read := envRead(t)
	exported := map[string]bool{}
	for _, v := range cellEnv {
		exported[v.name] = true
	}
	for name, at := range read {
		if !exported[name] && notExported[name] == "" {
			t.Errorf("%s is read (%s) but assay-dev dev --serve does not export it: add it to cellEnv, or to notExported with why", name, at)
		}
	}
	for name := range exported {
		if read[name] == "" {
			t.Errorf("assay-dev dev --serve exports %s, which no command reads", name)
		}
		if notExported[name] != "" {
			t.Errorf("%s is both exported and left out", name)
		}
	}
	for name := range notExported {
		if read[name] == "" {
			t.Errorf("notExported names %s, which no command reads", name)
		}
	}
	for _, want := range []string{"ASSAY_URL", "ASSAY_TOKEN", "ASSAY_REGION", "ASSAY_DATABASE_URL", "ASSAY_NATS_URL"} {
		if !exported[want] {
			t.Errorf("%s is not exported", want)
		}
	}
}

// envRead finds, in the non-test source of assay (..) and of assay-dev
// (.), the variables read from the environment, each with where it is
// first read.
func envRead(t *testing.T) map[string]string {
	fset := gotoken.NewFileSet()
	read := map[string]string{}
	add := func(name string, at gotoken.Pos) {
		if read[name] == "" {
			read[name] = fset.Position(at).String()
		}
	}
	for _, dir := range []string{"..", "."} {
		pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
		if err != nil {
			t.Fatal(err)
		}
		if pkgs["main"] == nil {
			t.Fatalf("%s holds no package main", dir)
		}
		for _, f := range pkgs["main"].Files {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				envReadIn(fn, add)
			}
		}
	}
	return read
}

var envName = regexp.MustCompile(`^"(ASSAY_[A-Z0-9_]+)"$`)

// envReadIn adds the variables fn reads: the name given to os.Getenv or
// envOr, every name in a function that calls os.Getenv with a variable,
// and config.Load's required settings when fn hands it os.Getenv.
func envReadIn(fn *ast.FuncDecl, add func(string, gotoken.Pos)) {
	passThrough := false
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		name := exprName(call.Fun)
		if (name == "os.Getenv" || name == "envOr") && len(call.Args) > 0 {
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && envName.MatchString(lit.Value) {
				add(envName.FindStringSubmatch(lit.Value)[1], lit.Pos())
			} else if name == "os.Getenv" {
				passThrough = true
			}
		}
		if name == "config.Load" && slices.ContainsFunc(call.Args, func(a ast.Expr) bool { return exprName(a) == "os.Getenv" }) {
			for _, v := range config.Shared(config.Need{}) {
				if strings.Contains(v.Usage, "required") {
					add(v.Name, call.Pos())
				}
			}
		}
		return true
	})
	if !passThrough {
		return
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && envName.MatchString(lit.Value) {
			add(envName.FindStringSubmatch(lit.Value)[1], lit.Pos())
		}
		return true
	})
}

// exprName is pkg.Name or Name for a selector or an identifier.
func exprName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprName(x.X) + "." + x.Sel.Name
	}
	return ""
}

// An ASSAY_DATABASE_URL left from an earlier serve's export line names a
// dev cell's database: assay-dev dev refuses it, saying why, before it starts
// anything.
func TestDevRefusesALeftoverExport(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", "postgres://postgres@127.0.0.1:1/assay_dev_us_1784211345")
	for _, args := range [][]string{{"dev"}, {"dev", "--serve"}} {
		var stderr bytes.Buffer
		if code := run(args, &stderr); code != 2 || !strings.Contains(stderr.String(), "a cell of an earlier assay-dev dev --serve (its export line)") ||
			!strings.Contains(stderr.String(), "unset ASSAY_DATABASE_URL") {
			t.Errorf("assay %s: exit %d, %q; want 2 and the export named", strings.Join(args, " "), code, stderr.String())
		}
	}
}

// assay-dev dev --serve, as make serve runs it: its export line sets
// exactly cellEnv, with values assay's commands work with; assay-dev dev
// webhook sends a delivery signed with the secret serve keeps, the cell
// fetches the diff from the fake GitHub, the work is accepted and its
// review is posted to the fake GitHub; Ctrl-C stops it all and removes the
// run file.
func TestServeTakesASignedDeliveryToTheFakeGitHub(t *testing.T) {
	assay := buildAssay(t)
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	for _, k := range []string{"ASSAY_MODEL_BASE_URL", "ASSAY_MODEL_ENDPOINT", "ASSAY_MODEL", "ASSAY_REGIONS", "ASSAY_URL", "ASSAY_TOKEN",
		"ASSAY_GITHUB_WEBHOOK_SECRET", "ASSAY_GITHUB_API_URL", "ASSAY_GITHUB_APP_ID", "ASSAY_GITHUB_APP_KEY_FILE", "ASSAY_GITHUB_TOKEN"} {
		t.Setenv(k, "")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	out, done := &serveOutput{}, make(chan error, 1)
	go func() { done <- devCommand(ctx, "dev", []string{"--serve", "--port", strconv.Itoa(freePort(t))}, out) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	text := out.waitFor(t, "dev webhook --repo acme/shop --pr 1 --wait", done)
	exports := parseExports(t, text)

	var hook bytes.Buffer
	if err := devCommand(ctx, "dev", []string{"webhook", "--repo", "acme/shop", "--pr", "1", "--wait"}, &hook); err != nil {
		t.Fatalf("assay-dev dev webhook: %v\n%s", err, hook.String())
	}
	m := regexp.MustCompile(`HTTP 202, work (w_[0-9a-z]+) `).FindStringSubmatch(hook.String())
	if m == nil || !strings.Contains(hook.String(), "work "+m[1]+": accepted (") ||
		!regexp.MustCompile(`published to github: check run [1-9][0-9]*, [1-9][0-9]* review comments`).MatchString(hook.String()) {
		t.Fatalf("assay-dev dev webhook --wait:\n%s\nwant the delivery accepted (202), the work accepted and published to github", hook.String())
	}
	workID := m[1]
	checkFakeGitHubReview(t, workID)
	checkExportsWork(t, ctx, assay, exports, workID)

	cancel()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("assay-dev dev --serve after Ctrl-C: %v", err)
	}
	if _, err := os.Stat(devRunFile()); !os.IsNotExist(err) {
		t.Errorf("run file %s left behind (%v)", devRunFile(), err)
	}
}

// checkFakeGitHubReview reads, from the fake GitHub serve names in its run
// file, the reviews of acme/shop#1: one is the work's, with comments.
func checkFakeGitHubReview(t *testing.T, workID string) {
	t.Helper()
	r, err := readServeRun(devRunFile())
	if err != nil || r.GitHub == "" {
		t.Fatalf("run file: %+v, %v; want the fake GitHub's URL", r, err)
	}
	req, _ := http.NewRequest(http.MethodGet, r.GitHub+"/repos/acme/shop/pulls/1/reviews", nil)
	req.Header.Set("Authorization", "token dev")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reviews []fakegithub.Review
	if err := json.NewDecoder(resp.Body).Decode(&reviews); err != nil || len(reviews) != 1 ||
		!strings.Contains(reviews[0].Body, "assay:work="+workID+" ") || reviews[0].CommitID != findPullOrFail(t).Head {
		t.Fatalf("reviews of acme/shop#1 on the fake GitHub: %+v (%v); want one, the work's, at the pull request's head", reviews, err)
	}
}

func findPullOrFail(t *testing.T) devPull {
	p, err := findPull("acme/shop", 1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// buildAssay builds assay, the operator's tool (..), into the test's
// temporary directory, as make build builds bin/assay.
func buildAssay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "assay")
	if out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput(); err != nil {
		t.Fatalf("go build -o %s ..: %v\n%s", bin, err, out)
	}
	return bin
}

// checkExportsWork runs assay, the operator's tool, with nothing but the
// export line's variables: the API ones (work get), the cell's database
// and NATS ones (work show reads both, tenant list the database).
func checkExportsWork(t *testing.T, ctx context.Context, assay string, exports map[string]string, workID string) {
	t.Helper()
	for k, v := range exports {
		t.Setenv(k, v)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"work", "get", workID}, []string{`"outcome": "accepted"`, `"target": "github"`}},
		{[]string{"work", "show", workID}, []string{workID, "github", "OUTCOME"}},
		{[]string{"tenant", "list"}, []string{"acme", "globex"}},
	} {
		var out, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, assay, c.args...)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err := cmd.Run()
		for _, w := range c.want {
			if err != nil || !strings.Contains(out.String(), w) {
				t.Errorf("assay %s with the export line: %v, %s, output lacks %q:\n%s", strings.Join(c.args, " "), err, stderr.String(), w, out.String())
				break
			}
		}
	}
}

// parseExports reads the export line for assay's commands from serve's
// output: its variables must be exactly cellEnv's, in order.
func parseExports(t *testing.T, text string) map[string]string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^    (export ASSAY_URL=.*)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no export line for assay's commands in:\n%s", text)
	}
	vars := map[string]string{}
	var names []string
	for _, kv := range regexp.MustCompile(`([A-Z_]+)=('[^']*'|\S+)`).FindAllStringSubmatch(m[1], -1) {
		names = append(names, kv[1])
		vars[kv[1]] = strings.Trim(kv[2], "'")
	}
	var want []string
	for _, v := range cellEnv {
		want = append(want, v.name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("export line sets %v, want %v:\n%s", names, want, m[1])
	}
	for k, v := range vars {
		if v == "" {
			t.Errorf("export line sets %s empty", k)
		}
	}
	if vars["ASSAY_REGION"] != "us" || vars["ASSAY_CELL"] != "us" || !strings.Contains(text, "export CELL="+vars["ASSAY_URL"]+" TOKEN="+vars["ASSAY_TOKEN"]+" ") {
		t.Errorf("export line %s: want the us cell, acme's token, the same as CELL and TOKEN:\n%s", m[1], text)
	}
	return vars
}

// serveOutput is serve's standard output, written while the test reads it.
type serveOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *serveOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *serveOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// waitFor waits, up to two minutes, until serve has printed want, and
// returns what it printed; serve ending first fails the test.
func (o *serveOutput) waitFor(t *testing.T, want string, done <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(o.String(), want) {
		select {
		case err := <-done:
			t.Fatalf("assay-dev dev --serve ended: %v\n%s", err, o.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("assay-dev dev --serve has not printed %q after 2m:\n%s", want, o.String())
		}
	}
	return o.String()
}

// freePort is a port nothing listens on now.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
