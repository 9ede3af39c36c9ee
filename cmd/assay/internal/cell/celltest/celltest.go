// Package celltest starts a cell for a test on real Postgres and real
// JetStream, with the simulated provider and a tenant, and gives the test
// the ways it reaches the cell: HTTP as a caller does, and the cell's
// database for what no API shows.
package celltest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"github.com/nats-io/nats.go"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/apicheck"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/schemas"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// Bundle is one cell on a fresh database and its own embedded NATS, with
// the simulated provider and tenant acme homed in it. The cell is region us
// of the default regions unless Options.Config names a Region (and its
// Regions); tenant globex (homed in eu, token "globex-token") is known too.
type Bundle struct {
	Cell   *cell.Cell
	Sim    *sim.Server
	Token  string // acme's
	Tenant string
	HTTP   *http.Client
	// DB is the test's own pool on the cell's database.
	DB *pgxpool.Pool
}

// Setup starts a cell with o (Config is filled in) and stops it when t
// ends.
func Setup(t *testing.T, o cell.Options) *Bundle { return SetupFront(t, o, nil) }

// SetupFront is Setup with front, when not nil, wrapped around the
// simulated provider: every model call of the cell passes through it.
func SetupFront(t *testing.T, o cell.Options, front func(http.Handler) http.Handler) *Bundle {
	return SetupOn(t, o, front, testenv.NATS(t))
}

// SetupOn is SetupFront on the NATS server at natsURL (a comma-separated
// list names the nodes of a cluster), which several cells (of one
// installation or several) may share. The cell's streams take
// Options.Config.Streams (replicas, placement).
func SetupOn(t *testing.T, o cell.Options, front func(http.Handler) http.Handler, natsURL string) *Bundle {
	t.Helper()
	ctx := context.Background()
	s := sim.New(sim.Options{})
	t.Cleanup(func() { _ = s.Close() })
	var simURL string
	if front == nil {
		var err error
		if simURL, err = s.Start("127.0.0.1:0"); err != nil {
			t.Fatalf("sim: %v", err)
		}
	} else {
		srv := httptest.NewServer(front(s))
		t.Cleanup(srv.Close)
		simURL = srv.URL
	}
	if o.WrapHTTP == nil {
		o.WrapHTTP = checkAPI(t)
	}
	dbURL := testenv.Database(t)
	region, regions := "us", config.DefaultRegions
	if o.Config.Region != "" {
		region, regions = o.Config.Region, o.Config.Regions
	}
	installation := cmp.Or(o.Config.Installation, "assay")
	if regions == nil {
		regions = config.DefaultRegions
	}
	// Each service has a pool of its own; four connections each keep
	// tests running side by side within the server's max_connections.
	o.Config = config.Config{Regions: regions, Region: region, Cell: cmp.Or(o.Config.Cell, region), Installation: installation,
		DatabaseURL: dbURL, NATSURL: natsURL, ModelBaseURL: sim.APIBase(simURL), Model: "assay-sim-1", HTTPAddr: "127.0.0.1:0",
		Streams: o.Config.Streams, DatabasePool: cmp.Or(o.Config.DatabasePool, 4)}
	if o.Log == nil {
		o.Log = telemetry.NewLogger(io.Discard, "test", region, slog.LevelInfo)
	}
	c, err := cell.Start(ctx, o)
	if err != nil {
		t.Fatalf("start cell: %v", err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Stop(sctx)
	})
	b := &Bundle{Cell: c, Sim: s, Tenant: "acme", Token: store.NewToken(), HTTP: &http.Client{Timeout: 20 * time.Second},
		DB: testenv.Pool(t, dbURL)}
	if err := c.Env.Store.SeedTenants(ctx, []store.TenantSeed{
		{ID: "acme", HomeRegion: region, Token: b.Token},
		{ID: "globex", HomeRegion: "eu", Token: "globex-token"},
	}); err != nil {
		t.Fatalf("seed: %v", err)
	}
	return b
}

// API is the checker every cell of the test binary holds its HTTP
// traffic to: the API's OpenAPI description (schemas/openapi.yaml).
var API = sync.OnceValues(func() (*apicheck.Checker, error) { return apicheck.New(schemas.OpenAPI) })

// checkAPI wraps a cell's HTTP surface in API's checks, and fails t with
// each request or answer the description does not allow once the cell has
// stopped (this cleanup is registered before the cell's own).
func checkAPI(t *testing.T) func(http.Handler) http.Handler {
	chk, err := API()
	if err != nil {
		t.Fatalf("the API's description: %v", err)
	}
	var mu sync.Mutex
	var problems []string
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("OpenAPI: %s", p)
		}
	})
	return func(h http.Handler) http.Handler {
		return chk.Wrap(h, func(p string) {
			mu.Lock()
			problems = append(problems, p)
			mu.Unlock()
		})
	}
}

// CodeReview is the code-review request for an evaluation item.
func CodeReview(it evalset.Item, title string) ingress.SubmitRequest {
	in, _ := json.Marshal(map[string]string{"diff": it.Diff, "title": title})
	return ingress.SubmitRequest{Contract: "code-review", SourceID: it.SourceID, Revision: it.Revision, Input: in}
}

// Post sends body to POST /v1/work with token.
func (b *Bundle) Post(t *testing.T, token string, body any) (int, []byte) {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/work", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/work: %v", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// Submit posts req as acme and fails unless it is accepted (202) or a
// duplicate (200).
func (b *Bundle) Submit(t *testing.T, req ingress.SubmitRequest) (int, ingress.SubmitResponse) {
	t.Helper()
	status, raw := b.Post(t, b.Token, req)
	var r ingress.SubmitResponse
	if status != http.StatusAccepted && status != http.StatusOK {
		t.Fatalf("POST /v1/work: HTTP %d: %s", status, raw)
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("decode: %v: %s", err, raw)
	}
	return status, r
}

// Wait polls GET /v1/work/{id} until the work has an outcome.
func (b *Bundle) Wait(t *testing.T, id string) ingress.WorkView {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/work/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/work/%s: HTTP %d: %s", id, resp.StatusCode, raw)
		}
		var v ingress.WorkView
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if v.Outcome != nil {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("work %s still %s after 60s", id, v.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Count runs a counting query on the cell's database.
func (b *Bundle) Count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.DB.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// WaitLedger waits until the ledger holds want rows for the tenant: attempt
// events are recorded asynchronously.
func (b *Bundle) WaitLedger(t *testing.T, tenant string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := b.Count(t, `SELECT count(*) FROM ledger WHERE tenant_id = $1`, tenant)
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("ledger rows for %s = %d, want %d", tenant, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// HandClassifiers returns a maker of classifiers of the cell that are not
// started, for tests that drive Process by hand. It does what a started
// classifier does around Process: it creates the RESULT and ATTEMPT
// streams, relays the classifiers' outbox rows and runs each one's relay.
func (b *Bundle) HandClassifiers(t *testing.T) func(classifier.Config) *classifier.Service {
	t.Helper()
	env := b.Cell.Env
	for _, k := range []string{event.KindResult, event.KindAttempt} {
		if _, err := event.EnsureStream(context.Background(), env.JS, nil, b.Names(), k, env.Config.Streams); err != nil {
			t.Fatal(err)
		}
	}
	relay := &outbox.Relay{Store: env.Store, JS: env.JS, Log: env.Log, Every: 20 * time.Millisecond,
		Streams: []string{event.KindResult, event.KindAttempt}}
	if err := relay.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Stop(context.Background()) })
	return func(cfg classifier.Config) *classifier.Service {
		t.Helper()
		cfg.Region, cfg.Names, cfg.Model = "us", env.Config.Names(), "assay-sim-1"
		s, err := classifier.New(cfg, classifier.Deps{Store: env.Store, JS: env.JS, Model: cell.ModelClient(env.Config),
			Contracts: env.Contracts, Log: env.Log, Tel: env.Tel})
		if err != nil {
			t.Fatal(err)
		}
		// Its own relay publishes the ATTEMPT events it records, which
		// have no outbox row for the relay above to find.
		if err := s.Relay().Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Relay().Stop(context.Background()) })
		return s
	}
}

// Calls is the simulated provider's call count for a tenant.
func (b *Bundle) Calls(tenant string) int64 { return b.Sim.Stats().Tenants[tenant].Calls }

// Names are the cell's NATS names.
func (b *Bundle) Names() event.Names { return b.Cell.Env.Config.Names() }

// Delivery stands for the message a hand-driven Process call handles,
// with the headers it is given.
type Delivery struct{ Header nats.Header }

// InProgress does nothing: no server waits on a hand-driven delivery.
func (Delivery) InProgress() error { return nil }

// Headers are the delivery's headers.
func (d Delivery) Headers() nats.Header { return d.Header }
