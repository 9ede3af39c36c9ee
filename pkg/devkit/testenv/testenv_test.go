package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { Main(m) }

func query[T any](t *testing.T, url, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestDatabaseIsEmptyAndDropped(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("use", func(t *testing.T) {
		url := Database(t)
		name = query[string](t, url, "select current_database()")
		if !strings.HasPrefix(name, "assay_t_") {
			t.Fatalf("database %q", name)
		}
		if n := query[int64](t, url, "select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'public'"); n != 0 {
			t.Fatalf("%d relations in public", n)
		}
		// A session left open must not stop the drop.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		if _, err := conn.Exec(ctx, "create table t (id int)"); err != nil {
			t.Fatal(err)
		}
	})
	if n := query[int64](t, PostgresURL(t), "select count(*) from pg_database where datname = $1", name); n != 0 {
		t.Fatalf("database %s survived its test", name)
	}
}

func TestDatabasesAreDistinct(t *testing.T) {
	t.Parallel()
	a, b := Database(t), Database(t)
	if a == b {
		t.Fatalf("same database twice: %s", a)
	}
}

func TestNATSJetStream(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx, "work.a", []byte("x")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream info %+v, %v", info, err)
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"postgres://u@h:1/postgres?sslmode=disable": "postgres://u@h:1/x?sslmode=disable",
		"postgresql://u@h/":                         "postgresql://u@h/x",
		"host=h user=u dbname=postgres":             "host=h user=u dbname=postgres dbname=x",
	}
	for in, want := range cases {
		got, err := withDatabase(in, "x")
		if err != nil || got != want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
