// Package dbpool sizes a service's Postgres pool. The store, which opens
// the pool, and config, which reports the size a service runs with, both
// read it here, so neither imports the other for it.
package dbpool

import (
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns is a service's pool when neither ASSAY_DATABASE_POOL nor
// the URL's pool_max_conns says otherwise.
const DefaultMaxConns = 10

// Size is how many connections a pool for url holds: asked when above 0,
// else the URL's pool_max_conns, else DefaultMaxConns.
func Size(url string, asked int) int {
	if asked > 0 {
		return asked
	}
	if cfg, err := pgxpool.ParseConfig(url); err == nil && strings.Contains(url, "pool_max_conns") {
		return int(cfg.MaxConns)
	}
	return DefaultMaxConns
}
