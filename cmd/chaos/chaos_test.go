package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"assay.dev/pkg/devkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestChaosSmall is the chaos harness at a size that fits in make test: a
// few hundred keys, some delivered ten times at once, with the services'
// short timings. A classifier is killed after the provider answered one of
// its calls and another holding an answer it had not recorded; answers come
// back broken; the services' database connections are cut; the broker
// crashes; a ledger is killed; a call stalls past AckWait while its work is
// delivered again. Every invariant must hold. It needs Postgres (and fails
// without it) and builds the binaries it runs. The committer's faults need
// its 30s AckWait and run in make chaos.
func TestChaosSmall(t *testing.T) {
	var out bytes.Buffer
	o := Options{
		Items: 200, DupKeys: 5, Load: 20 * time.Second, Seed: 42, Quiesce: 2 * time.Minute, Settle: 4 * time.Second,
		Faults: []string{FaultClassifierAfterAnswer, FaultClassifierBeforePublish, FaultModelInvalid,
			FaultPGTerminate, FaultNATSCrash, FaultKillLedger, FaultModelStall},
		FastTimings: true,
		DatabaseURL: testenv.PostgresURL(t),
	}
	ok, err := Run(context.Background(), o, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("chaos run failed: %v", err)
	}
	if !ok {
		t.Fatal("an invariant was violated; the table above names it")
	}
}

// TestChaosClusterSmall is the cluster mode at a size that fits in make
// test: each cell a three-node JetStream cluster with R3 streams, a
// Postgres primary with a synchronous standby, two processes of every
// service; a few hundred keys while the leader of one of a cell's streams
// is cut from its two peers and, later (seed 47 puts it there, with most
// of the cell's work acknowledged before it), a cell's primary is killed,
// its standby promoted and the old primary rejoined. Every invariant must hold,
// stranded work back in flight within 60s of each fault's end and nothing
// acknowledged lost across the failover among them. It starts its own
// Postgres servers (and fails without the server's tools).
func TestChaosClusterSmall(t *testing.T) {
	var out bytes.Buffer
	o := Options{
		Cluster: true, Items: 300, DupKeys: 5, Load: 45 * time.Second, Seed: 47, Quiesce: 2 * time.Minute, Settle: 4 * time.Second,
		Faults:   []string{FaultNATSPartition, FaultPGFailover},
		FaultFor: 8 * time.Second, FastTimings: true,
	}
	ok, err := Run(context.Background(), o, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("chaos run failed: %v", err)
	}
	if !ok {
		t.Fatal("an invariant was violated; the table above names it")
	}
}
