package host

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// part is a lifecycle part whose readiness the test sets.
type part struct{ notReady atomic.Pointer[error] }

func (p *part) Start(context.Context) error { return nil }
func (p *part) Stop(context.Context)        {}
func (p *part) Ready(context.Context) error {
	if e := p.notReady.Load(); e != nil {
		return *e
	}
	return nil
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// /readyz tells anyone only whether the process is ready; why it is not
// goes to the log, once for each new reason.
func TestReadyzTellsOnlyReadyOrNot(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	p := &part{}
	why := errors.New("store: ping: failed to connect to `host=10.1.2.3 user=assay database=assay`: password authentication failed")
	p.notReady.Store(&why)
	srv := httptest.NewServer(Mux(nil, &Env{Log: slog.New(slog.NewJSONHandler(logs, nil))}, p))
	t.Cleanup(srv.Close)
	probe := func() (int, string) {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	for range 3 {
		if status, body := probe(); status != http.StatusServiceUnavailable || body != `{"status":"not ready"}` {
			t.Fatalf("not ready: %d %s", status, body)
		}
	}
	if n := strings.Count(logs.String(), "password authentication failed"); n != 1 {
		t.Fatalf("the reason was logged %d times over three probes, want once:\n%s", n, logs)
	}
	p.notReady.Store(nil)
	if status, body := probe(); status != http.StatusOK || body != `{"status":"ready"}` {
		t.Fatalf("ready: %d %s", status, body)
	}
	if !strings.Contains(logs.String(), `"msg":"ready"`) {
		t.Fatalf("becoming ready was not logged:\n%s", logs)
	}
}

// A NATS URL's password is never in the error that stops start-up.
func TestConnectErrorRedactsTheNATSPassword(t *testing.T) {
	t.Parallel()
	const password = "s3cr3t-nats-pw"
	cfg := config.Config{Region: "us", DatabaseURL: testenv.Database(t), NATSURL: "nats://assay:" + password + "@127.0.0.1:1"}
	_, err := Connect(t.Context(), "test", cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	if strings.Contains(err.Error(), password) || !strings.Contains(err.Error(), "assay:xxxxx@127.0.0.1:1") {
		t.Fatalf("error %q: want the URL with its password redacted", err)
	}
}

// /metrics is served on ASSAY_METRICS_ADDR's listener alone: the API's
// handler answers it 404 whatever the settings, so tenant ids and volumes
// never show on the API port.
func TestMetricsOnTheirOwnPort(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.Setup(context.Background(), "metricsport", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	get := func(h http.Handler) (int, string) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	apart := &Env{Log: log, Tel: tel, Config: config.Config{HTTPAddr: "127.0.0.1:8080", MetricsAddr: "127.0.0.1:9090"}}
	if code, body := get(Mux(http.NotFoundHandler(), apart)); code != http.StatusNotFound || strings.Contains(body, "assay_build_info") {
		t.Errorf("the API's port answered /metrics with %d", code)
	}
	if code, body := get(MetricsMux(apart)); code != http.StatusOK || !strings.Contains(body, "assay_build_info") {
		t.Errorf("the metrics port answered /metrics with %d:\n%.300s", code, body)
	}
	unset := &Env{Log: log, Tel: tel, Config: config.Config{HTTPAddr: "127.0.0.1:8080"}}
	if code, body := get(Mux(nil, unset)); code != http.StatusNotFound || strings.Contains(body, "assay_build_info") {
		t.Errorf("without ASSAY_METRICS_ADDR the API's port answered /metrics with %d", code)
	}
}

// Two instances of a cell label the same tenants, the cell's first
// ASSAY_METRICS_TENANTS in the order its database added them, whatever
// order each meets them in: a label cap by first sight would give each
// replica its own set.
func TestTenantLabelsAgreeAcrossReplicas(t *testing.T) {
	t.Parallel()
	db, nc := testenv.Database(t), testenv.NATS(t)
	cfg := config.Config{Region: "us", Regions: []string{"us"}, DatabaseURL: db, NATSURL: nc, MetricsTenants: 2}
	first, err := Connect(t.Context(), "ingress", cfg, slog.New(slog.DiscardHandler), telemetry.WithTenantLabels(cfg.MetricsTenants))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close(context.Background())
	for _, id := range []string{"tenant-c", "tenant-a", "tenant-d", "tenant-b"} {
		if err := first.Store.SeedTenants(t.Context(), []store.TenantSeed{{ID: id, HomeRegion: "us", Token: store.NewToken()}}); err != nil {
			t.Fatal(err)
		}
	}
	// The first instance read its labels before the tenants existed; the
	// second reads them now. Each meets the tenants in another order.
	first.labelTenants(t.Context())
	second, err := Connect(t.Context(), "ingress", cfg, slog.New(slog.DiscardHandler), telemetry.WithTenantLabels(cfg.MetricsTenants))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close(context.Background())
	want := map[string]string{"tenant-c": "tenant-c", "tenant-a": "tenant-a", "tenant-d": telemetry.OtherTenants, "tenant-b": telemetry.OtherTenants}
	for i, order := range [][]string{{"tenant-b", "tenant-d", "tenant-a", "tenant-c"}, {"tenant-c", "tenant-a", "tenant-d", "tenant-b"}} {
		env := []*Env{first, second}[i]
		for _, id := range order {
			if got := env.Tel.Tenant(id); got != want[id] {
				t.Errorf("instance %d: %s labelled %q, want %q", i+1, id, got, want[id])
			}
		}
	}
}

// A NATS server without JetStream stops start-up at once, saying so and
// naming the server, rather than failing later with "no responders".
func TestConnectRefusesNATSWithoutJetStream(t *testing.T) {
	t.Parallel()
	url := testenv.NATSWithoutJetStream(t)
	cfg := config.Config{Region: "us", DatabaseURL: testenv.Database(t), NATSURL: url, StartupWait: time.Minute}
	env, err := Connect(t.Context(), "test", cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		env.Close(context.Background())
		t.Fatal("connected to a server without JetStream")
	}
	if want := "JetStream is not enabled on " + url; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

// Each wait for Postgres or NATS names where it waits and how long it
// goes on; the error it gives up with is the last try's.
func TestRetryNamesWhereItWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		log := slog.New(slog.NewJSONHandler(logs, nil))
		refused := errors.New("nats: no servers available for connection")
		tries := 0
		start := time.Now()
		err := retry(t.Context(), log, "nats", "nats://assay:xxxxx@10.0.0.9:4222", 3*time.Second, func(context.Context) error {
			tries++
			return refused
		})
		if !errors.Is(err, refused) {
			t.Fatalf("retry = %v, want the last try's error", err)
		}
		if took := time.Since(start); took > 3*time.Second || tries < 3 {
			t.Errorf("%d tries over %s, want several within the 3s wait", tries, took)
		}
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		if len(lines) != tries-1 {
			t.Errorf("%d warnings for %d tries:\n%s", len(lines), tries, logs)
		}
		for _, l := range lines {
			if !strings.Contains(l, `"msg":"waiting for nats"`) || !strings.Contains(l, `"url":"nats://assay:xxxxx@10.0.0.9:4222"`) ||
				!strings.Contains(l, `"gives_up_in":`) {
				t.Errorf("warning %s does not name the URL and when it gives up", l)
			}
		}
	})
}

// Closing the connection on the way out is not a disconnection to warn
// about.
func TestCloseLogsNoDisconnection(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	cfg := config.Config{Region: "us", DatabaseURL: testenv.Database(t), NATSURL: testenv.NATS(t)}
	env, err := Connect(t.Context(), "test", cfg, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	env.Close(context.Background())
	if !strings.Contains(logs.String(), `"msg":"nats: connected"`) {
		t.Fatalf("the connection was not logged:\n%s", logs)
	}
	if strings.Contains(logs.String(), "disconnected") {
		t.Errorf("closing warned of a disconnection:\n%s", logs)
	}
}
