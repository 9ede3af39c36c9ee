package cell_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/testenv"
)

// assay-dev dev --serve on the same ports and with the same tokens run after
// run, printing every endpoint, the operator token and the export line the
// examples of docs/ use; a taken port falls back to a free one. Each
// cell's metrics are on a free port of their own, printed, and the API's
// port answers /metrics 404.
func TestDevServeIsStableAndComplete(t *testing.T) {
	t.Setenv("ASSAY_DATABASE_URL", testenv.PostgresURL(t))
	t.Setenv("ASSAY_MODEL_BASE_URL", "")
	secrets := filepath.Join(t.TempDir(), "assay", "dev-serve.json")
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addrs := []string{free(), taken.Addr().String()}
	start := func() *cell.Dev {
		t.Helper()
		e, err := cell.StartDev(t.Context(), cell.DevOptions{LogTo: io.Discard, Addrs: addrs, Secrets: secrets})
		if err != nil {
			if e != nil {
				e.Stop()
			}
			t.Fatal(err)
		}
		return e
	}
	first := start()
	var out bytes.Buffer
	first.PrintEndpoints(&out)
	acme, operator, us := first.Token("acme"), first.OperatorToken, first.Cells["us"].URL
	metrics := first.Cells["us"].MetricsURL
	first.Stop()
	if metrics == "" || metrics == us {
		t.Errorf("the us cell's metrics are at %q, its API at %s: want a port of their own", metrics, us)
	}
	if us != "http://"+addrs[0] {
		t.Errorf("the us cell listens on %s, want %s", us, addrs[0])
	}
	text := out.String()
	for _, want := range []string{"export CELL=" + us + " TOKEN=" + acme + " OPERATOR_TOKEN=" + operator,
		"/v1/batches", "/v1/reviews", "/v1/views", "/v1/work/{id}/events", "/console", "/v1/usage", "operator", secrets,
		metrics + "/metrics"} {
		if !strings.Contains(text, want) {
			t.Errorf("the endpoints lack %q:\n%s", want, text)
		}
	}
	// The export line is last: the log does not bury it.
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if !strings.Contains(strings.Join(lines[len(lines)-2:], "\n"), "export CELL=") {
		t.Errorf("the export line is not at the end:\n%s", text)
	}

	second := start()
	defer second.Stop()
	if second.Token("acme") != acme || second.OperatorToken != operator || second.Cells["us"].URL != us {
		t.Errorf("a second run: token %s, operator %s, %s; want the first run's", second.Token("acme"), second.OperatorToken, second.Cells["us"].URL)
	}
	if eu := second.Cells["eu"].URL; eu == "http://"+addrs[1] || eu == "" {
		t.Errorf("the eu cell listens on %s, a port already taken", eu)
	}
	req, _ := http.NewRequest(http.MethodGet, us+"/v1/console", nil)
	req.Header.Set("Authorization", "Bearer "+operator)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/console with the operator token: HTTP %d", resp.StatusCode)
	}
	for base, want := range map[string]int{second.Cells["us"].URL: http.StatusNotFound, second.Cells["us"].MetricsURL: http.StatusOK} {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusNotFound) == strings.Contains(string(body), "assay_build_info") {
			t.Errorf("GET %s/metrics: HTTP %d, want %d", base, resp.StatusCode, want)
		}
	}
}
