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
