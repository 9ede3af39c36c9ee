package classifier_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

// TestStartsWhileTheClusterForms starts the classifier against a new
// three-node cluster of which one node runs, then two: JetStream does not
// answer until the cluster has formed. It stays up throughout, waiting,
// starts once the third node joins, becomes ready, serves, and every
// stream and bucket it made has three replicas on the region's servers.
func TestStartsWhileTheClusterForms(t *testing.T) {
	t.Parallel()
	c := testenv.NewFormingCluster(t, 3, 1, "region:us")
	streams := event.StreamSettings{Replicas: 3, Placement: []string{"region:us"}, Wait: 3 * time.Minute}
	b := newBundle(t, c.URL(), streams)
	started := make(chan error, 1)
	go func() { started <- b.svc.Start(t.Context()) }()

	waits := func() int { return strings.Count(b.log.String(), `"msg":"waiting for jetstream"`) }
	alive := func(stage string, before int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for waits() <= before {
			select {
			case err := <-started:
				t.Fatalf("%s: Start returned %v before the cluster could hold its streams", stage, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no wait for JetStream logged within a minute; the log:\n%s", stage, b.log.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	alive("one node of three", 0)
	c.Start(t, "n2")
	alive("two nodes of three", waits())
	c.Start(t, "n3")
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start once the third node joined: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("not started within 2 minutes of the third node joining; the log:\n%s", b.log.String())
	}
	// It serves: an announcement becomes a result.
	// (the WORK stream is ingress's, which the test makes as it would).
	b.enqueue(t, "post-1", "buy now, free money")
	b.events(t, event.KindAttempt, 1)
	deadline := time.Now().Add(time.Minute)
	for {
		err := b.svc.Ready(t.Context())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready within a minute of serving: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, kind := range []string{event.KindResult, event.KindAttempt} {
		st, err := b.js.Stream(ctx, names.Stream(kind))
		if err != nil {
			t.Fatal(err)
		}
		placed(t, st.CachedInfo().Config.Replicas, st.CachedInfo().Config.Placement, names.Stream(kind))
	}
	for _, bucket := range []string{names.CapacityBucket(), names.CallsBucket()} {
		var kv jetstream.KeyValue
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if kv, err = b.js.KeyValue(ctx, bucket); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("bucket %s: %v", bucket, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		placed(t, info.Config.Replicas, info.Config.Placement, "bucket "+bucket)
	}
}

// placed fails t unless what has three replicas on the region's servers.
func placed(t *testing.T, replicas int, p *jetstream.Placement, what string) {
	t.Helper()
	if replicas != 3 || p == nil || len(p.Tags) != 1 || p.Tags[0] != "region:us" {
		t.Errorf("%s: %d replicas placed %+v; want 3 on region:us", what, replicas, p)
	}
}

// A stream configuration the server refuses for good (three replicas on a
// server that is not clustered) stops the start at once, naming the
// stream, however long the start may wait for a cluster.
func TestStartStopsAtOnceOnARefusalWaitingCannotMend(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.NATS(t), event.StreamSettings{Replicas: 3, Wait: 10 * time.Minute})
	err := b.svc.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), names.Stream(event.KindResult)) {
		t.Fatalf("start = %v; want the refusal of stream %s", err, names.Stream(event.KindResult))
	}
	if strings.Contains(b.log.String(), `"msg":"waiting for jetstream"`) {
		t.Fatalf("it waited on a refusal no wait mends:\n%s", b.log.String())
	}
}
