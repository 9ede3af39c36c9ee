// Package testenv gives every module's tests real services: a Postgres
// database per test and an embedded NATS server with JetStream. A test that
// cannot get a service fails; it never skips.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/devpg"
)

// DefaultPostgresURL is the local server tried when ASSAY_TEST_DATABASE_URL
// is unset.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	pgOnce    sync.Once
	pgURL     string
	pgErr     error
	clusterMu sync.Mutex
	cluster   *devpg.Cluster
)

// Main runs the package's tests and then stops whatever testenv started, so
// that no throwaway cluster outlives the test binary. Use it from TestMain.
// Each of after runs once the tests have, while what they started still
// runs, and may turn the exit code into a failure.
func Main(m *testing.M, after ...func(code int) int) {
	code := m.Run()
	for _, f := range after {
		code = f(code)
	}
	clusterMu.Lock()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
		}
		cluster = nil
	}
	clusterMu.Unlock()
	os.Exit(code)
}

// PostgresURL returns the URL of a server's maintenance database: from
// ASSAY_TEST_DATABASE_URL, else the local server on 5432 if it answers within
// 2s, else a throwaway cluster started once per process.
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	pgOnce.Do(func() { pgURL, pgErr = resolvePostgres() })
	if pgErr != nil {
		tb.Fatalf("testenv: no PostgreSQL for tests: %v", pgErr)
	}
	return pgURL
}

func resolvePostgres() (string, error) {
	if u := os.Getenv("ASSAY_TEST_DATABASE_URL"); u != "" {
		return u, nil
	}
	probeErr := ping(DefaultPostgresURL, 2*time.Second)
	if probeErr == nil {
		return DefaultPostgresURL, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devpg.Start(ctx, "")
	if err != nil {
		return "", fmt.Errorf("ASSAY_TEST_DATABASE_URL is unset, %s did not answer (%v), and a throwaway cluster could not be started: %w", DefaultPostgresURL, probeErr, err)
	}
	clusterMu.Lock()
	cluster = c
	clusterMu.Unlock()
	return c.URL("postgres"), nil
}

func ping(u string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// Database creates an empty database with a unique name and returns its URL.
// The database is dropped, with any sessions still on it, when tb ends.
func Database(tb testing.TB) string {
	tb.Helper()
	base := PostgresURL(tb)
	var rnd [8]byte
	rand.Read(rnd[:])
	name := "assay_t_" + hex.EncodeToString(rnd[:])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin(ctx, base, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testenv: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := admin(ctx, base, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := withDatabase(base, name)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return u
}

// Pool opens a pool on the database at url for a test's own reads and
// writes (setting rows up, reading them back), closed when tb ends.
func Pool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("testenv: pool: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}

// admin runs one statement on the maintenance database. CREATE DATABASE
// fails while another session sits in the template, so that case is retried
// briefly.
func admin(ctx context.Context, base, stmt string) error {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for attempt := 1; ; attempt++ {
		_, err = conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if err == nil || attempt == 5 || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// withDatabase points a URL or keyword/value connection string at db.
func withDatabase(base, db string) (string, error) {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		u.Path = "/" + db
		u.RawPath = ""
		return u.String(), nil
	}
	// In keyword/value form the last setting of a key wins.
	return base + " dbname=" + db, nil
}

// NATS returns the client URL of a NATS server with JetStream: from
// ASSAY_TEST_NATS_URL, else an embedded server owned by tb.
func NATS(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("ASSAY_TEST_NATS_URL"); u != "" {
		return u
	}
	s, err := StartNATS(tb.TempDir())
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s.ClientURL()
}

// JetStream connects to NATS(tb) and returns its JetStream; the
// connection closes when tb ends.
func JetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(NATS(tb))
	if err != nil {
		tb.Fatalf("testenv: connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("testenv: jetstream: %v", err)
	}
	return js
}

// NATSWithoutJetStream returns the client URL of an embedded NATS server
// that has JetStream off, owned by tb: what a service must refuse.
func NATSWithoutJetStream(tb testing.TB) string {
	tb.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		tb.Fatalf("testenv: embedded nats-server: %v", err)
	}
	s.Start()
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("testenv: embedded nats-server not ready for connections within 10s")
	}
	return s.ClientURL()
}

// StartNATS starts an embedded NATS server with JetStream storing under dir,
// listening on a free port on 127.0.0.1.
func StartNATS(dir string) (*server.Server, error) { return StartNATSOn(dir, -1) }

// StartNATSOn is StartNATS on the given port (-1: a free one), for a test
// that restarts a server where its clients reconnect.
func StartNATSOn(dir string, port int) (*server.Server, error) {
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("embedded nats-server not ready for connections within 10s")
	}
	return s, nil
}
