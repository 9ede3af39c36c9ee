package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// A tenant submits, watches, gets and lists its work with the CLI over the
// HTTP API: the events come as JSON lines ending in the end event, a
// second submit is the same work, another tenant's token sees none of it,
// and refusals come back as the API's code and message.
func TestTenantWorkCommands(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := b.Cell.Env.Store.SeedTenants(ctx, []store.TenantSeed{{ID: "initech", HomeRegion: "us", Token: "initech-token"}}); err != nil {
		t.Fatal(err)
	}
	acme, other := write("acme.token", b.Token+"\n"), write("initech.token", "initech-token")
	req := celltest.CodeReview(evalset.Items()[0], "cli")
	req.SourceID = "shop/cli#1"
	raw, _ := json.Marshal(req)
	reqFile := write("req.json", string(raw))
	work := func(token string, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		args = append(args, "--url", b.Cell.URL, "--token-file", token)
		err := workCmd(ctx, args, &out)
		return out.String(), err
	}

	out, err := work(acme, "submit", reqFile, "--watch")
	if err != nil {
		t.Fatalf("submit --watch: %v\n%s", err, out)
	}
	var events []string
	var workID string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev struct {
			Event string
			Data  struct {
				WorkID, Outcome string
			}
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		events = append(events, ev.Event)
		if ev.Data.WorkID != "" {
			workID = ev.Data.WorkID
		}
	}
	want := []string{"queued", "running", "attempt", "accepted", "end"}
	if strings.Join(events, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", events, want)
	}

	out, err = work(acme, "submit", reqFile)
	var sr ingress.SubmitResponse
	if err != nil || json.Unmarshal([]byte(out), &sr) != nil || !sr.Duplicate || sr.WorkID != workID {
		t.Fatalf("second submit: %v %q, want the duplicate %s", err, out, workID)
	}

	out, err = work(acme, "get", workID)
	var v ingress.WorkView
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.State != "accepted" || v.Result == nil {
		t.Fatalf("get: %v %q, want the accepted work with its result", err, out)
	}
	out, err = work(acme, "list")
	if err != nil || !strings.Contains(out, workID) || !strings.HasPrefix(out, "WORK") {
		t.Fatalf("list: %v %q, want a table naming %s", err, out, workID)
	}
	out, err = work(acme, "list", "--json", "--since", "1h", "--state", "accepted")
	var list ingress.WorkList
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Items) != 1 || list.Items[0].WorkID != workID {
		t.Fatalf("list --json: %v %q", err, out)
	}

	var refused *cli.APIError
	for _, args := range [][]string{{"get", workID}, {"watch", workID}} {
		if out, err := work(other, args...); !errors.As(err, &refused) || refused.Status != 404 || refused.Code != "not_found" {
			t.Errorf("%v with another tenant's token: %v %q, want 404 not_found", args, err, out)
		}
	}
	if out, err := work(other, "list"); err != nil || strings.Contains(out, workID) {
		t.Errorf("list with another tenant's token: %v, shows %q", err, out)
	}
	if _, err := work(acme, "list", "--state", "sideways"); !errors.As(err, &refused) || refused.Code != "invalid_query" {
		t.Errorf("list --state sideways: %v, want 400 invalid_query", err)
	}
	bad := write("bad.json", `{"contract":"pr-review"`)
	if _, err := work(acme, "submit", bad); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Errorf("submit of a file that is not JSON: %v", err)
	}
	var cerr cli.ConfigError
	if err := workCmd(ctx, []string{"get", workID, "--url", b.Cell.URL}, &bytes.Buffer{}); !errors.As(err, &cerr) ||
		!strings.Contains(err.Error(), "ASSAY_TOKEN") {
		t.Errorf("get without a token: %v, want a setting error naming $ASSAY_TOKEN", err)
	}
}

// A stream cut after its first event is asked for again from that event's
// id, and every event is shown once.
func TestWatchPicksUpACutStream(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	status, sr := b.Submit(t, celltest.CodeReview(evalset.Items()[1], "cut stream"))
	if status != 202 {
		t.Fatalf("submit: HTTP %d", status)
	}
	b.Wait(t, sr.WorkID)
	target, _ := url.Parse(b.Cell.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	var mu sync.Mutex
	var marks []string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		marks = append(marks, r.Header.Get("Last-Event-ID"))
		first := len(marks) == 1
		mu.Unlock()
		if !first {
			proxy.ServeHTTP(w, r)
			return
		}
		// The first connection gets the first event and is closed.
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, b.Cell.URL+r.URL.Path, nil)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		frame, _ := bufio.NewReader(resp.Body).ReadString('}')
		_, _ = io.WriteString(w, frame+"\n\n")
	}))
	t.Cleanup(front.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(b.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := workCmd(context.Background(), []string{"watch", sr.WorkID, "--url", front.URL, "--token-file", tokenFile}, &out); err != nil {
		t.Fatalf("watch: %v\n%s", err, out.String())
	}
	var events []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ev struct{ Event string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		events = append(events, ev.Event)
	}
	if got, want := strings.Join(events, " "), "queued running attempt accepted end"; got != want {
		t.Errorf("events %q, want %q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) != 2 || marks[0] != "" || marks[1] == "" {
		t.Errorf("Last-Event-ID of each connection %q: want none, then the first event's id", marks)
	}
}
