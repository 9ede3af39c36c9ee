package door

import (
	"errors"
	"testing"

	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var errNotYet = errors.New("not running yet")

// cell is what the door's parts are stressed against: a fresh, migrated
// database.
type cell struct{ st *store.Store }

func lifecycleEnv(t *testing.T) *cell {
	t.Helper()
	st, _ := storetest.Migrated(t)
	return &cell{st: st}
}
