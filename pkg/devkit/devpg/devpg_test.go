package devpg

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func selectOne(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 = %d, %v", one, err)
	}
	var enc string
	if err := conn.QueryRow(ctx, "show server_encoding").Scan(&enc); err != nil || enc != "UTF8" {
		t.Fatalf("server_encoding = %q, %v", enc, err)
	}
}

func TestStartSelectStop(t *testing.T) {
	t.Parallel()
	c, err := Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if !strings.HasPrefix(c.URL("postgres"), "postgres://postgres@127.0.0.1:") || c.Port() == 0 {
		t.Fatalf("URL = %s", c.URL("postgres"))
	}
	selectOne(t, c.URL("postgres"))

	dir := c.dir
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dir %s still there: %v", dir, err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Fatal("server still answers after Stop")
	}
}

func TestStartInGivenDir(t *testing.T) {
	t.Parallel()
	// A dir that does not exist yet belongs to the cluster and goes with it.
	parent, err := os.MkdirTemp("", "devpg-parent-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	os.Chmod(parent, 0o755)
	dir := filepath.Join(parent, "pg")
	c, err := Start(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	selectOne(t, c.URL("template1"))
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dir %s still there: %v", dir, err)
	}
}

func TestReapLeaked(t *testing.T) {
	t.Parallel()
	c, err := Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	// Pretend the owner died: a pid that cannot be running.
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte("2147483646"), 0o644); err != nil {
		t.Fatal(err)
	}
	reapLeaked(context.Background(), c.bin, c.cred)
	if _, err := os.Stat(c.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("leaked cluster %s not reaped: %v", c.dir, err)
	}
}
