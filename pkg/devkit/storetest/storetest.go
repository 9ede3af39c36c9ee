// Package storetest opens the cell's store for a test, on a database of
// the test's own. It lives in the dev kit, beside testenv, so that no
// non-test package of assay.dev/pkg depends on the dev kit.
package storetest

import (
	"testing"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
)

// Migrated is a store on a fresh, migrated database of the test's own with
// tenants seeded, closed when the test ends, and that database's URL. A
// test that cannot reach Postgres fails here.
func Migrated(t testing.TB, tenants ...store.TenantSeed) (*store.Store, string) {
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
	if len(tenants) > 0 {
		if err := st.SeedTenants(ctx, tenants); err != nil {
			t.Fatal(err)
		}
	}
	return st, url
}
