package ledger

import (
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newLedger builds a ledger of region us on d, not started. A nil d.Log
// discards; d.Tel is made here.
func newLedger(t *testing.T, cfg Config, d Deps) *Service {
	t.Helper()
	if d.Log == nil {
		d.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tel := telemetrytest.Provider(t, "ledger", "us")
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
	var seeds []store.TenantSeed
	for _, id := range tenants {
		seeds = append(seeds, store.TenantSeed{ID: id, HomeRegion: "us", Token: "tok-" + id})
	}
	st, url := storetest.Migrated(t, seeds...)
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
func newMemLedger(t *testing.T, cfg Config) (*Service, *memStore, *testenv.DecisionLog) {
	t.Helper()
	m := newMemStore(t)
	log := &testenv.DecisionLog{}
	return newLedger(t, cfg, Deps{Store: m, Log: slog.New(slog.NewJSONHandler(log, nil))}), m, log
}
