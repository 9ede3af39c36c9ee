// Package store is the cell's system of record: migrations and every query
// the services run against the cell's Postgres. Each state change is one
// guarded statement; a unique constraint, not a read, decides a race.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/dbpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrateLock is the advisory lock key that serialises migrations across
// every service starting at once.
const migrateLock = 0x61737361 // "assa"

// Store is the cell's database. Its pool stays inside: every query the
// services run is a method here.
type Store struct {
	pool *pgxpool.Pool
}

// Options adjust the pool Open makes.
type Options struct {
	// MaxConns bounds the pool's connections; 0 keeps the URL's
	// pool_max_conns, else dbpool.DefaultMaxConns.
	MaxConns int
	// Tracer, when set, sees every statement the pool sends (the pipeline
	// benchmark counts them).
	Tracer pgx.QueryTracer
}

// Open connects to the cell's database and checks that it answers.
func Open(ctx context.Context, url string, opts ...Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: parse url: %w", err)
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	cfg.MaxConns = int32(dbpool.Size(url, o.MaxConns))
	// Each statement is planned for its values when it runs. Left to
	// itself, Postgres keeps a prepared statement's generic plan after five
	// runs, made from the statistics of that moment: on a new cell's nearly
	// empty tables that plan scans them whole, and it stays until the next
	// ANALYZE (the commit group ran a sequential scan of attempts per row).
	// A plan_cache_mode in the URL wins.
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	if o.Tracer != nil {
		cfg.ConnConfig.Tracer = o.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: ping: %w", err)
	}
	return &Store{pool: pool}, nil
}

// EnsureDatabase creates the database url names when it does not exist,
// connecting with the same credentials to the server's maintenance
// database (postgres). created says whether it made it. A role that may not
// create databases gets an error that says so.
func EnsureDatabase(ctx context.Context, url string) (created bool, err error) {
	// Parsed as the pool parses it, so the pool's own settings in the URL
	// (pool_max_conns, …) are not sent to the server as parameters.
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return false, fmt.Errorf("store: parse url: %w", err)
	}
	cfg := pcfg.ConnConfig
	name := cfg.Database
	if name == "" || name == "postgres" {
		return false, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		conn.Close(ctx)
		return false, nil
	}
	if SQLState(err) != "3D000" { // invalid_catalog_name: it does not exist
		return false, fmt.Errorf("store: connect: %w", err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("store: database %s does not exist, and connecting to create it failed: %w", name, err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	switch code := SQLState(err); {
	case err == nil:
		return true, nil
	case code == "42P04": // duplicate_database: another process made it first
		return false, nil
	case code == "42501": // insufficient_privilege
		return false, fmt.Errorf("store: database %s does not exist and this role may not create it (CREATEDB); create it first: %w", name, err)
	}
	return false, fmt.Errorf("store: create database %s: %w", name, err)
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that the database answers, for readiness.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// Migrate applies the embedded migrations that are not yet applied, in
// order, under an advisory lock. It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLock); err != nil {
		return nil, fmt.Errorf("store: migrate lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrateLock) //nolint:errcheck
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	var applied []string
	for _, version := range Versions() {
		body, err := migrations.ReadFile("migrations/" + version + ".sql")
		if err != nil {
			return nil, err
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING`, version)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			applied = append(applied, version)
			_, err = tx.Exec(ctx, string(body))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("store: migration %s: %w", version, err)
		}
	}
	return applied, nil
}

// Versions lists the embedded migrations in the order they apply.
func Versions() []string {
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	sort.Strings(names)
	for i, n := range names {
		names[i] = strings.TrimSuffix(strings.TrimPrefix(n, "migrations/"), ".sql")
	}
	return names
}

// execer is what a pool and a transaction share.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// querier is what a pool and a transaction share for reading.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// interval passes a duration to Postgres exactly, whatever its unit.
func interval(d time.Duration) int64 { return d.Microseconds() }

// ErrNotFound is returned when a row asked for by key does not exist.
var ErrNotFound = errors.New("store: not found")

// Unsent reports whether err came before the statement reached the server
// (no connection could be had: the server full, down or unreachable), so
// nothing of it was done and sending it again cannot do it twice.
func Unsent(err error) bool {
	var ce *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &ce)
}

// Permanent reports whether err is the database refusing data for good: a
// data exception (SQLSTATE class 22: bytes that are not text, a value out
// of range) or an integrity violation (class 23). Retrying such a write can
// never succeed; anything else (a lost connection 08, a serialization
// failure 40, a shutdown 57, too many connections 53) may pass on retry.
func Permanent(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	return pe.Code[:2] == "22" || pe.Code[:2] == "23"
}

// Refusal says in words why the database refused a value for good (an
// error Permanent reports), for a caller who sent it: no SQLSTATE, no
// Postgres message.
func Refusal(err error) string {
	if code := SQLState(err); strings.HasPrefix(code, "23") {
		return "a value breaks one of the cell's constraints"
	}
	return "a value is one the database cannot store (out of range, too long, or not text)"
}

// SQLState is err's SQLSTATE, "" when the database did not answer one.
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
