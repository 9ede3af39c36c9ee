package testenv

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"
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

// A three-node cluster forms, holds an R3 stream placed by tag on all
// three, keeps every acknowledged message when the stream's leader is shut
// down, takes new ones under the next leader, and the node, started again,
// catches up.
func TestClusterKeepsR3StreamAcrossLeaderLoss(t *testing.T) {
	t.Parallel()
	c := NewCluster(t, 3, "region:us")
	if got := len(strings.Split(c.URL(), ",")); got != 3 {
		t.Fatalf("URL %q names %d servers, want 3", c.URL(), got)
	}
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3,
		Storage: jetstream.FileStorage, Placement: &jetstream.Placement{Tags: []string{"region:us"}}})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream is not R3 with a leader and two replicas: replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	if l := c.StreamLeader("R3"); l != info.Cluster.Leader {
		t.Fatalf("StreamLeader %q, stream info says %q", l, info.Cluster.Leader)
	}
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			// Retried while the stream elects a leader; the message id
			// keeps a retry of a publish that did land from storing twice.
			for try := 0; ; try++ {
				// Each try waits for its ack a little while: a publish sent
				// to a node as it stops is never answered.
				tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(tctx, "r3.x", []byte(strconv.Itoa(i)), jetstream.WithMsgID("m"+strconv.Itoa(i)))
				tcancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("publish %d: %v (last error)", i, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	publish(0, 50)
	old := c.StopStreamLeader(t, "R3")
	if c.Server(old) != nil {
		t.Fatalf("node %s still running", old)
	}
	next, err := c.WaitStreamLeader("R3", old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	publish(50, 100)
	info, err = st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 100 || info.Cluster.Leader != next {
		t.Fatalf("after losing leader %s: %d messages (want 100), leader %q (want %s)", old, info.State.Msgs, info.Cluster.Leader, next)
	}
	c.Start(t, old)
	if err := c.WaitStreamCurrent("R3", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The node started again holds every message in its own store.
	own, err := c.NodeStreamState(old, "R3")
	if err != nil {
		t.Fatal(err)
	}
	msgs := own.Msgs
	if msgs != 100 {
		t.Fatalf("node %s holds %d messages after catching up, want 100", old, msgs)
	}
}

// TestClusterNodeJoinsWhenItsPortsWereTaken: a node that has not started
// yet, whose client and route ports another process took meanwhile, starts
// on free ones, and the three nodes form one cluster with a meta leader.
func TestClusterNodeJoinsWhenItsPortsWereTaken(t *testing.T) {
	t.Parallel()
	c := NewFormingCluster(t, 3, 2, "region:us")
	n3 := c.node("n3")
	taken := []int{n3.opts.Port, n3.opts.Cluster.Port}
	for _, p := range taken {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("take port %d: %v", p, err)
		}
		defer l.Close()
	}
	c.Start(t, "n3")
	if got := []int{n3.opts.Port, n3.opts.Cluster.Port}; got[0] == taken[0] || got[1] == taken[1] {
		t.Fatalf("n3 listens on %v, ports %v were taken", got, taken)
	}
	if err := c.WaitReady(time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Servers()); n != 3 {
		t.Fatalf("%d nodes running, want 3", n)
	}
	for _, s := range c.Servers() {
		if routes := s.NumRoutes(); routes == 0 {
			t.Fatalf("node %s has no route to the others", s.Name())
		}
	}
}

// TestDecisionLogReadsDecisionsBack: the decisions a JSON slog logger
// writes through telemetry's form come back in order, by key or attempt;
// other lines are passed over.
func TestDecisionLogReadsDecisionsBack(t *testing.T) {
	var l DecisionLog
	log := slog.New(slog.NewJSONHandler(&l, nil))
	log.Info("decision", "key", "w_1", "outcome", "accepted", "reason", "gate passed", "attempt", "a_1")
	log.Info("serving", "addr", "127.0.0.1:1")
	log.Info("decision", "key", "w_1", "outcome", "duplicate", "reason", "seen")
	log.Info("decision", "key", "w_2", "outcome", "refused", "reason", "other region")
	if got := l.Decisions(t); len(got) != 3 || got[0] != (Decision{Key: "w_1", Attempt: "a_1", Outcome: "accepted", Reason: "gate passed"}) {
		t.Fatalf("decisions %+v", got)
	}
	if got := l.OutcomesOf(t, "w_1"); !slices.Equal(got, []string{"accepted", "duplicate"}) {
		t.Errorf("of w_1: %v", got)
	}
	if got := l.OutcomesOf(t, "a_1"); !slices.Equal(got, []string{"accepted"}) {
		t.Errorf("of a_1: %v", got)
	}
}
