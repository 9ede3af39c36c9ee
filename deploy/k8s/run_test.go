package k8s

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

// binaries are built once per test process, from this checkout, into a
// directory of the user's cache named after the checkout: each run replaces
// them (a rename, so a process still running one is not disturbed) rather
// than leaving a new directory behind.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// binary is the path of one of assay's binaries (a service, or assay),
// built from this checkout.
func binary(t *testing.T, name string) string {
	t.Helper()
	binOnce.Do(func() { binDir, binErr = buildBinaries() })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, name)
}

func buildBinaries() (string, error) {
	here, err := filepath.Abs(".")
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(here))
	dir := filepath.Join(cache, "assay-k8s-test", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for _, b := range []struct{ name, dir, pkg string }{
		{"ingress", "../../services/ingress", "./cmd/ingress"},
		{"classifier", "../../services/classifier", "./cmd/classifier"},
		{"committer", "../../services/committer", "./cmd/committer"},
		{"ledger", "../../services/ledger", "./cmd/ledger"},
		{"assay", "../../cmd/assay", "."},
	} {
		tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d", b.name, os.Getpid()))
		cmd := exec.Command("go", "build", "-o", tmp, b.pkg)
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("go build %s: %v\n%s", b.name, err, out)
		}
		if err := os.Rename(tmp, filepath.Join(dir, b.name)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

var assayVar = regexp.MustCompile(`\bASSAY_[A-Z0-9_]+\b`)

// helpVars are the variables a service binary's --help lists.
func helpVars(t *testing.T, name string) map[string]bool {
	t.Helper()
	out, err := exec.Command(binary(t, name), "--help").Output()
	if err != nil {
		t.Fatalf("%s --help: %v", name, err)
	}
	vars := map[string]bool{}
	for _, v := range assayVar.FindAllString(string(out), -1) {
		vars[v] = true
	}
	if !vars["ASSAY_DATABASE_URL"] || !vars["ASSAY_HTTP_ADDR"] {
		t.Fatalf("%s --help lists %v: not the help this test reads", name, keys(vars))
	}
	return vars
}

// TestEnvIsWhatTheBinariesRead: every variable a container sets is one its
// binary reads: for a service, one its --help lists (or OTEL_*, which the
// telemetry reads); for the migration Job, one config.Shared lists for a
// service that needs no model (what assay migrate loads). SSL_CERT_DIR is
// read by Go's crypto/x509 and must name a mounted volume.
func TestEnvIsWhatTheBinariesRead(t *testing.T) {
	migrate := map[string]bool{}
	for _, v := range config.Shared(config.Need{}) {
		migrate[v.Name] = true
	}
	for _, cell := range cells {
		s, m := loadCell(t, cell)
		for _, s := range []*set{s, m} {
			for name, p := range podSpecs(s) {
				for _, c := range p.Spec.Containers {
					bin := strings.TrimPrefix(c.Command[0], "/usr/local/bin/")
					known := migrate
					if bin != "assay" {
						known = helpVars(t, bin)
					} else if !slices.Equal(c.Command[1:2], []string{"migrate"}) {
						t.Errorf("%s: %s runs assay %v; this test knows the variables of assay migrate only", s.dir, name, c.Command[1:])
					}
					for _, e := range c.Env {
						switch {
						case known[e.Name], strings.HasPrefix(e.Name, "OTEL_"), runtimeVars[e.Name]:
						case e.Name == "SSL_CERT_DIR":
							if mountOf(c, p.Spec, e.Value) == nil {
								t.Errorf("%s: %s: SSL_CERT_DIR=%s is not a mounted volume", s.dir, name, e.Value)
							}
						default:
							t.Errorf("%s: %s sets %s, which %s does not read", s.dir, name, e.Name, bin)
						}
					}
					if len(c.EnvFrom) > 0 {
						t.Errorf("%s: %s: envFrom hides which variables are set", s.dir, name)
					}
				}
			}
		}
	}
}

// runtimeVars are variables every binary reads through what it is built
// with rather than its --help: the Go runtime's memory limit, and pgx's
// libpq settings (TestOverlaysRenderAndDecode checks their values).
var runtimeVars = map[string]bool{"GOMEMLIMIT": true, "PGSSLMODE": true, "PGSSLROOTCERT": true}

// mountOf is the volume mounted at path in c, if any.
func mountOf(c corev1.Container, p corev1.PodSpec, path string) *corev1.Volume {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			for i := range p.Volumes {
				if p.Volumes[i].Name == m.Name {
					return &p.Volumes[i]
				}
			}
		}
	}
	return nil
}

// TestCellStartsFromItsManifests starts each cell as its manifests say: a
// three-node NATS cluster configured like the cell's Helm values (the
// accounts file of nats/<cell>, the server tags, TLS on the client port),
// a real Postgres database, the migration Job's command and then each
// Deployment's command, with the container's environment. What differs from
// a pod: Secrets hold test values (each service's own NATS user and
// password, the test database, the test CA), the model's URL is a local
// server, and ASSAY_HTTP_ADDR keeps the manifest's port out of the way of
// this machine's (the port itself is checked against the container port and
// the probes by TestOverlaysRenderAndDecode). Each service must answer its
// probes — the liveness path 200, the readiness path 200 once its part of
// JetStream is there, /metrics — and stop cleanly on SIGTERM; the streams
// must be R3 and placed on the cell's tagged servers.
func TestCellStartsFromItsManifests(t *testing.T) {
	// Each region on the NATS kustomization that serves all its cells (us
	// as its two cells on nats/us-with-us-2), so every cell with an
	// overlay runs.
	var run []natsKustomization
	for _, region := range regions {
		var all natsKustomization
		for _, k := range natsKustomizations {
			if k.region == region && len(k.cells) > len(all.cells) {
				all = k
			}
		}
		run = append(run, all)
	}
	var ran []string
	for _, k := range run {
		ran = append(ran, k.cells...)
	}
	// A cell on one node on its own NATS server (nats/single).
	var single []string
	for _, cell := range cellIDs {
		if singleNode[cell] {
			single = append(single, cell)
		}
	}
	if ran = append(ran, single...); !slices.Equal(sorted(ran), sorted(cellIDs)) {
		t.Fatalf("the runs cover cells %v, want every cell %v", ran, cellIDs)
	}
	for _, k := range run {
		t.Run(k.region, func(t *testing.T) { runRegion(t, k) })
	}
	for _, cell := range single {
		t.Run(cell, func(t *testing.T) { runSingleNode(t, cell) })
	}
}

// runSingleNode starts one nats-server from the configuration the cell's
// manifests mount (nats/single's nats.conf, its listen addresses and store
// moved to this machine's), then the cell from its manifests, as
// startCell does.
func runSingleNode(t *testing.T, cell string) {
	s, _ := loadCell(t, cell)
	opts := singleNodeNATSOptions(t, s)
	ports := freePorts(t, 2)
	opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort = "127.0.0.1", ports[0], "127.0.0.1", ports[1]
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	r := startCell(t, cell, singleNATS{srv, fmt.Sprintf("nats://127.0.0.1:%d", ports[0])}, newCA(t))
	r.stop(t)
}

// cellNATS is the NATS a cell runs on in these tests: where each of its
// services connects, and the streams of an account.
type cellNATS interface {
	url(cell, svc string) string
	streams(t *testing.T, account string) map[string]*server.StreamDetail
}

// singleNATS is one server without accounts (nats/single): every client
// connects to it as no user, in its global account.
type singleNATS struct {
	srv  *server.Server
	addr string
}

func (n singleNATS) url(_, _ string) string { return n.addr }

func (n singleNATS) streams(t *testing.T, _ string) map[string]*server.StreamDetail {
	t.Helper()
	return (&natsCluster{servers: []*server.Server{n.srv}}).streams(t, "$G")
}

// runRegion starts the region's NATS from k, then each of its cells from
// its manifests, and checks that every cell of the region registered in
// the region's placement map where its ingress answers the others, as its
// assay-cell ConfigMap says.
func runRegion(t *testing.T, k natsKustomization) {
	ca := newCA(t)
	nc := startNATSCluster(t, k, natsValues(t, k.region), ca)
	var runs []*cellRun
	for _, cell := range k.cells {
		runs = append(runs, startCell(t, cell, nc, ca))
	}
	conn, err := nats.Connect(nc.url(k.cells[0], "placer"), nats.RootCAs(ca.file))
	if err != nil {
		t.Fatalf("the placer of %s: %v", k.cells[0], err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	names := event.Names{Installation: cellConfig(t, runs[0].s).Data["installation"], Cell: k.cells[0]}
	kv, err := js.KeyValue(ctx, names.PlacementBucket(k.region))
	if err != nil {
		t.Fatalf("the region's placement map: %v", err)
	}
	// The map as its readers see it: a watch, which delivers every key's
	// latest value and then a nil.
	w, err := kv.Watch(ctx, "cell.*")
	if err != nil {
		t.Fatalf("watch the region's placement map: %v", err)
	}
	registered := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			break
		}
		registered[strings.TrimPrefix(e.Key(), "cell.")] = string(e.Value())
	}
	w.Stop()
	for _, r := range runs {
		if want := cellConfig(t, r.s).Data["cell-url"]; !strings.Contains(registered[r.cell], want) {
			t.Errorf("cell %s is not in the region's placement map at %s: %q", r.cell, want, registered[r.cell])
		}
	}
	for _, r := range runs {
		r.stop(t)
	}
}

// cellRun is one cell's services, started from its manifests.
type cellRun struct {
	cell       string
	s          *set
	procs      []*proc
	mu         sync.Mutex
	modelCalls int
}

type proc struct {
	name    string
	cmd     *exec.Cmd
	addr    chan string
	metrics chan string
	log     *syncBuffer
	done    chan error
}

// startCell runs the cell's migration Job's command, then its four
// services, each with the environment its Deployment gives it (Secrets
// and ConfigMaps resolved, addresses on loopback), and checks each one's
// probes, its metrics port and the streams of the cell's account.
func startCell(t *testing.T, cell string, nc cellNATS, ca *testCA) *cellRun {
	s, m := loadCell(t, cell)
	run := &cellRun{cell: cell, s: s}

	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		run.mu.Lock()
		run.modelCalls++
		run.mu.Unlock()
		http.Error(w, `{"error":{"message":"no model in this test"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(model.Close)

	caDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(caDir, "ca.crt"), ca.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	db := testenv.Database(t)
	secretValues := map[string]map[string]string{
		"assay-pg-app":    {"uri": db},
		"assay-model":     {"api-key": "test-api-key"},
		"assay-github":    {"webhook-secret": "test-webhook-secret", "token": "test-token"},
		"assay-nats-urls": {},
	}
	for _, svc := range append(services, "placement", "publisher") {
		// Each service on its own user, spread over the three servers; the
		// ingress's placement user and the committer's publisher user are
		// in the region's account.
		secretValues["assay-nats-urls"][svc] = nc.url(cell, svc)
	}
	env := func(where string, c corev1.Container, p corev1.PodSpec, cms map[string]*corev1.ConfigMap) []string {
		var out []string
		for _, e := range c.Env {
			v := e.Value
			switch {
			case e.Name == "ASSAY_NATS_URL" && e.ValueFrom == nil:
				// The manifest's own server (nats/single), by its Service's
				// name: here, the test's.
				v = nc.url(cell, strings.TrimPrefix(where, "Deployment/"))
			case e.Name == "SSL_CERT_DIR":
				vol := mountOf(c, p, e.Value)
				if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "nats-ca" {
					t.Fatalf("%s: SSL_CERT_DIR is not the nats-ca Secret's mount", where)
				}
				v = caDir
			case e.Name == "ASSAY_HTTP_ADDR" || e.Name == "ASSAY_METRICS_ADDR":
				v = "127.0.0.1:0"
			case e.Name == "PGSSLMODE":
				// The test database has no TLS; the manifest's verify-full and
				// its CA are checked by TestOverlaysRenderAndDecode.
				v = "disable"
			case e.Name == "PGSSLROOTCERT":
				continue
			case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
				r := e.ValueFrom.ConfigMapKeyRef
				v = cms[r.Name].Data[r.Key]
				if strings.HasPrefix(r.Name, "assay-model-") && r.Key == "base-url" {
					v = model.URL
				}
			case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
				r := e.ValueFrom.SecretKeyRef
				var ok bool
				if v, ok = secretValues[r.Name][r.Key]; !ok {
					t.Fatalf("%s: %s reads Secret %s key %s, which this test has no value for", where, e.Name, r.Name, r.Key)
				}
			case e.ValueFrom != nil:
				t.Fatalf("%s: %s: a valueFrom this test cannot resolve", where, e.Name)
			}
			out = append(out, e.Name+"="+v)
		}
		return out
	}
	command := func(c corev1.Container) (string, []string) {
		return binary(t, strings.TrimPrefix(c.Command[0], "/usr/local/bin/")), append(c.Command[1:], c.Args...)
	}

	// The migration Job first, as the install order says.
	job := m.jobs["assay-migrate"].Spec.Template.Spec
	bin, args := command(job.Containers[0])
	cmd := exec.Command(bin, args...)
	cmd.Env = env("Job/assay-migrate", job.Containers[0], job, m.configMaps)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "migration(s) applied") {
		t.Fatalf("the migration Job's command: %v\n%s", err, out)
	}

	for _, name := range services {
		p := s.deployments[name].Spec.Template.Spec
		c := p.Containers[0]
		bin, args := command(c)
		pr := &proc{name: name, cmd: exec.Command(bin, args...), addr: make(chan string, 1), metrics: make(chan string, 1),
			log: &syncBuffer{}, done: make(chan error, 1)}
		pr.cmd.Env = env("Deployment/"+name, c, p, s.configMaps)
		stderr, err := pr.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		pr.cmd.Stdout = pr.log
		if err := pr.cmd.Start(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		go watchLog(stderr, pr.log, pr.addr, pr.metrics)
		go func() { pr.done <- pr.cmd.Wait() }()
		run.procs = append(run.procs, pr)
		t.Cleanup(func() {
			if pr.cmd.ProcessState == nil {
				pr.cmd.Process.Kill()
			}
		})
	}

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(u string) (int, string) {
		resp, err := client.Get(u)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, pr := range run.procs {
		c := s.deployments[pr.name].Spec.Template.Spec.Containers[0]
		var addr string
		select {
		case addr = <-pr.addr:
		case err := <-pr.done:
			t.Fatalf("%s exited before serving: %v\n%s", pr.name, err, pr.log.String())
		case <-time.After(90 * time.Second):
			t.Fatalf("%s did not serve HTTP within 90s\n%s", pr.name, pr.log.String())
		}
		base := "http://" + addr
		if code, body := get(base + c.LivenessProbe.HTTPGet.Path); code != http.StatusOK {
			t.Errorf("%s: liveness %s: %d %s", pr.name, c.LivenessProbe.HTTPGet.Path, code, body)
		}
		if code, body := get(base + c.StartupProbe.HTTPGet.Path); code != http.StatusOK {
			t.Errorf("%s: startup %s: %d %s", pr.name, c.StartupProbe.HTTPGet.Path, code, body)
		}
		// Readiness follows the cell: the classifier's lane consumers need
		// the WORK stream ingress creates, the committer's and the ledger's
		// the streams the classifier creates.
		var code int
		var body string
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if code, body = get(base + c.ReadinessProbe.HTTPGet.Path); code == http.StatusOK {
				break
			}
		}
		if code != http.StatusOK {
			t.Errorf("%s: readiness %s never 200 (last %d %q)\n%s", pr.name, c.ReadinessProbe.HTTPGet.Path, code, body, pr.log.String())
		}
		// /metrics is on the metrics port alone: the http port (the API's,
		// on ingress) answers it 404.
		var maddr string
		select {
		case maddr = <-pr.metrics:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not serve its metrics port\n%s", pr.name, pr.log.String())
		}
		if code, body := get("http://" + maddr + "/metrics"); code != http.StatusOK || !strings.Contains(body, "assay_build_info") {
			t.Errorf("%s: /metrics on the metrics port: %d, assay_build_info missing", pr.name, code)
		}
		if code, _ := get(base + "/metrics"); code != http.StatusNotFound {
			t.Errorf("%s: /metrics on the http port: %d, want 404", pr.name, code)
		}
	}

	// Every stream in the cell's account, whoever created it, has a replica
	// on each server and is placed by the cell's tag, and so is every kind
	// the code names; on one server without accounts, the streams are of
	// one replica, unplaced, in its global account.
	var placement []string
	if p, ok := cellConfig(t, s).Data["stream-placement"]; ok {
		placement = strings.Split(p, ",")
	}
	replicas := natsServers(t, s)
	names := event.Names{Installation: cellConfig(t, s).Data["installation"], Cell: cell}
	account := strings.ToUpper(strings.ReplaceAll(names.Installation+"_"+cell, "-", "_"))
	if _, single := nc.(singleNATS); single {
		account = "$G"
	}
	streams := nc.streams(t, account)
	for _, kind := range event.Kinds {
		if streams[names.Stream(kind)] == nil {
			t.Errorf("%s: not created (streams: %v)", names.Stream(kind), keys(streams))
		}
	}
	for name, sd := range streams {
		if strings.HasPrefix(name, "KV_") && slices.Contains(softBuckets(names), strings.TrimPrefix(name, "KV_")) {
			continue
		}
		var tags []string
		if sd.Config.Placement != nil {
			tags = sd.Config.Placement.Tags
		}
		if sd.Config.Replicas != replicas || !slices.Equal(tags, placement) {
			t.Errorf("%s: %d replicas, placement %+v; want %d on %v", name, sd.Config.Replicas, sd.Config.Placement, replicas, placement)
		}
		if replicas > 1 && (sd.Cluster == nil || sd.Cluster.Leader == "" || len(sd.Cluster.Replicas) != replicas-1) {
			t.Errorf("%s: cluster %+v, want a leader and %d replicas", name, sd.Cluster, replicas-1)
		}
	}

	return run
}

// stop sends each service SIGTERM: each drains and exits 0, and none was
// refused anything by the NATS server or called the model.
func (r *cellRun) stop(t *testing.T) {
	t.Helper()
	for _, pr := range r.procs {
		if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, pr := range r.procs {
		if err := <-pr.done; err != nil {
			t.Errorf("%s %s after SIGTERM: %v\n%s", r.cell, pr.name, err, pr.log.String())
		}
		if strings.Contains(pr.log.String(), "Permissions Violation") || strings.Contains(pr.log.String(), "permissions violation") {
			t.Errorf("%s %s: the NATS server refused its user something\n%s", r.cell, pr.name, pr.log.String())
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.modelCalls != 0 {
		t.Errorf("%s: the model was called %d times with no work submitted", r.cell, r.modelCalls)
	}
}

// watchLog copies a service's log into buf and sends the addresses it logs
// "serving" and "serving metrics" with.
func watchLog(r io.Reader, buf *syncBuffer, addr, metrics chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	sent := map[string]bool{}
	for sc.Scan() {
		line := sc.Bytes()
		buf.Write(append(slices.Clone(line), '\n'))
		var rec struct{ Msg, Addr string }
		if json.Unmarshal(line, &rec) != nil || rec.Addr == "" || sent[rec.Msg] {
			continue
		}
		switch rec.Msg {
		case "serving":
			addr <- rec.Addr
		case "serving metrics":
			metrics <- rec.Addr
		}
		sent[rec.Msg] = true
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func streamInfo(t *testing.T, url string, ca *testCA, stream string) *jetstream.StreamInfo {
	t.Helper()
	conn, err := nats.Connect(url, nats.RootCAs(ca.file))
	if err != nil {
		t.Fatalf("connect %s: %v", stream, err)
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return info
}

// natsCluster is a region's test NATS: three servers, and each user of
// each of its cells (by cell, then service).
type natsCluster struct {
	clientPorts []int
	users       map[string]map[string]string
	passwords   map[string]map[string]string
	servers     []*server.Server
}

// regionUsers are a cell's users in its region's account.
var regionUsers = []string{"placement", "placer", "publisher"}

// url is where the service (or a region user) of cell connects, with its
// user; the users are spread over the three servers.
func (nc *natsCluster) url(cell, svc string) string {
	i := slices.Index(append(services, regionUsers...), svc)
	return fmt.Sprintf("tls://%s:%s@127.0.0.1:%d", nc.users[cell][svc], nc.passwords[cell][svc], nc.clientPorts[i%len(nc.clientPorts)])
}

// streams are the streams of account, as the servers that hold them report
// them (a stream of one replica is on one server only).
func (nc *natsCluster) streams(t *testing.T, account string) map[string]*server.StreamDetail {
	t.Helper()
	out := map[string]*server.StreamDetail{}
	for _, s := range nc.servers {
		jsz, err := s.Jsz(&server.JSzOptions{Account: account, Streams: true, Config: true})
		if err != nil {
			t.Fatalf("%s: jsz: %v", s.Name(), err)
		}
		for _, a := range jsz.AccountDetails {
			for i := range a.Streams {
				sd := a.Streams[i]
				if prev := out[sd.Name]; prev == nil || prev.Cluster == nil || prev.Cluster.Leader == "" {
					out[sd.Name] = &sd
				}
			}
		}
	}
	return out
}

// softBuckets are the key-value buckets that hold only what their writers
// report again within seconds (the capacity reports, the ingress token
// buckets): kept in memory on one server and made again when lost.
func softBuckets(n event.Names) []string { return []string{n.CapacityBucket(), n.AdmitBucket()} }

// startNATSCluster starts three nats-servers in this process, each from a
// configuration file laid out as the Helm chart lays it out for the
// region's values: /etc/nats-config/nats.conf under a directory of its
// own, k's accounts file where the values mount it, included first, then
// the server's name, JetStream on file storage, the server tags, the
// cluster and TLS on the client port.
func startNATSCluster(t *testing.T, k natsKustomization, v *natsHelmValues, ca *testCA) *natsCluster {
	t.Helper()
	nc := &natsCluster{users: map[string]map[string]string{}, passwords: map[string]map[string]string{}}
	for _, cell := range k.cells {
		nc.users[cell], nc.passwords[cell] = map[string]string{}, map[string]string{}
		env := strings.ToUpper(strings.ReplaceAll("assay_"+cell, "-", "_"))
		for _, svc := range append(services, regionUsers...) {
			nc.users[cell][svc] = "assay-" + cell + "-" + svc
			var b [16]byte
			rand.Read(b[:])
			// The form assay nats-config draws: p and 32 hex digits.
			nc.passwords[cell][svc] = "p" + hex.EncodeToString(b[:])
			t.Setenv(env+"_"+strings.ToUpper(svc)+"_NATS_PASSWORD", nc.passwords[cell][svc])
		}
		// The operator's user (assay streams, assay replay) runs in no pod,
		// but the accounts file names its password too.
		t.Setenv(env+"_OPS_NATS_PASSWORD", "p"+strings.Repeat("0", 32))
	}
	accounts, err := os.ReadFile(k.dir + "/assay.conf")
	if err != nil {
		t.Fatal(err)
	}
	n := v.Config.Cluster.Replicas
	ports := freePorts(t, 2*n)
	nc.clientPorts = ports[:n]
	var routes []string
	for _, p := range ports[n:] {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	cert, key := ca.serverCert(t)
	var servers []*server.Server
	for i := range n {
		dir := t.TempDir()
		confDir := filepath.Join(dir, "etc", "nats-config")
		mount, _ := v.accountsVolume()
		accountsDir := filepath.Join(dir, mount.MountPath)
		for _, d := range []string{confDir, accountsDir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(accountsDir, "assay.conf"), accounts, 0o600); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca.certPEM} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		tags, _ := json.Marshal(v.Config.Merge.ServerTags)
		rs, _ := json.Marshal(routes)
		conf := fmt.Sprintf(`include %q;
server_name: %s-%d
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
  max_memory_store: 0
  max_file_store: 1GB
}
server_tags: %s
cluster {
  name: %s
  listen: 127.0.0.1:%d
  no_advertise: true
  routes: %s
}
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
}
`, v.Config.Merge.Include, v.Config.Cluster.Merge.Name, i, nc.clientPorts[i], filepath.Join(dir, v.Config.JetStream.FileStore.Dir),
			tags, v.Config.Cluster.Merge.Name, ports[n+i], rs,
			filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"))
		path := filepath.Join(confDir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("nats.conf: %v\n%s", err, conf)
		}
		// The chart's jetstream block follows the include's "jetstream:
		// enabled" and must win, or the store would not be the volume.
		if !opts.JetStream || opts.StoreDir != filepath.Join(dir, v.Config.JetStream.FileStore.Dir) {
			t.Fatalf("the included accounts file overrode the JetStream store: %v %q", opts.JetStream, opts.StoreDir)
		}
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		servers = append(servers, s)
		nc.servers = append(nc.servers, s)
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	}
	for _, s := range servers {
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatalf("nats-server %s not ready", s.Name())
		}
	}
	// JetStream is usable once the meta group has a leader.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ready := 0
		for _, s := range servers {
			if s.JetStreamIsClustered() && s.JetStreamIsCurrent() {
				ready++
			}
		}
		if ready == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the NATS cluster's JetStream has no meta leader")
		}
	}
	return nc
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// testCA is a certificate authority for the test's NATS TLS.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	file    string
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "assay test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.file = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca.file, ca.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return ca
}

// serverCert is a certificate for 127.0.0.1, signed by the CA.
func (ca *testCA) serverCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}
