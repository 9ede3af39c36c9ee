package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newLedger builds a ledger of region us on d, not started. A nil d.Log
// discards; d.Tel is made here.
func newLedger(t *testing.T, cfg Config, d Deps) *Service {
	t.Helper()
	if d.Log == nil {
		d.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tel, err := telemetry.Setup(t.Context(), "ledger", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	d.Tel = tel
	s, err := New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newTestDatabase is a fresh, migrated database with the tenants, homed
// in us, whose tokens are "tok-" and their ids; and a pool for the test's
// own reads and writes.
func newTestDatabase(t *testing.T, tenants ...string) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	url := testenv.Database(t)
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var seeds []store.TenantSeed
	for _, id := range tenants {
		seeds = append(seeds, store.TenantSeed{ID: id, HomeRegion: "us", Token: "tok-" + id})
	}
	if err := st.SeedTenants(ctx, seeds); err != nil {
		t.Fatal(err)
	}
	return st, testenv.Pool(t, url)
}

// newTestLedger is a ledger of region us on a fresh, migrated database with
// the tenants (homed in us), not started and without JetStream.
func newTestLedger(t *testing.T, cfg Config, tenants ...string) (*Service, *store.Store, *pgxpool.Pool) {
	t.Helper()
	st, db := newTestDatabase(t, tenants...)
	return newLedger(t, cfg, Deps{Store: st}), st, db
}

// newMemLedger is a ledger of region us on a memStore, not started and
// without JetStream, whose decisions the returned log holds.
func newMemLedger(t *testing.T, cfg Config) (*Service, *memStore, *decisionLog) {
	t.Helper()
	m := newMemStore(t)
	log := &decisionLog{}
	return newLedger(t, cfg, Deps{Store: m, Log: slog.New(slog.NewJSONHandler(log, nil))}), m, log
}

// decisionLog is a JSON log the ledger writes and a test reads its
// decisions back from.
type decisionLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *decisionLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// of returns the outcomes of the decisions logged for key, in the order
// they were made.
func (l *decisionLog) of(t *testing.T, key string) []string {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for line := range strings.Lines(l.b.String()) {
		var d struct{ Msg, Key, Outcome string }
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if d.Msg == "decision" && d.Key == key {
			out = append(out, d.Outcome)
		}
	}
	return out
}
