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

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
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
