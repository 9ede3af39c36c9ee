package event_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

// TestEnsureStreamConcurrentlyOnCluster starts two instances of a service
// at once on a three-node cluster: both ensure the same R3 streams at the
// same moment, and both must be answered. Creating or updating them with
// CreateOrUpdateStream, the update of one instance met the other's create
// in flight and neither was ever answered, so both instances failed to
// start; and a create made while an equal one is in flight goes
// unanswered too. A stream found with another configuration is still
// updated.
func TestEnsureStreamConcurrentlyOnCluster(t *testing.T) {
	t.Parallel()
	c := testenv.NewCluster(t, 3, "region:us")
	settings := event.StreamSettings{Replicas: 3, Placement: []string{"region:us"}}
	js := make([]jetstream.JetStream, 2)
	for i := range js {
		nc, err := nats.Connect(c.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if js[i], err = jetstream.New(nc); err != nil {
			t.Fatal(err)
		}
	}
	for round, cell := range []string{"ra", "rb", "rc"} {
		n := event.Names{Cell: cell}
		var wg sync.WaitGroup
		for i := range js {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, kind := range event.Kinds {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := event.EnsureStream(ctx, js[i], nil, n, kind, settings)
					cancel()
					if err != nil {
						t.Errorf("round %d, instance %d: %v", round, i, err)
					}
				}
			}()
		}
		wg.Wait()
	}
	// Another instance's create is in flight as this one ensures.
	for round, cell := range []string{"rd", "re", "rf"} {
		n := event.Names{Cell: cell}
		go func() {
			_, _ = js[1].CreateStream(context.Background(), event.StreamConfig(n, event.KindResult, settings))
		}()
		time.Sleep(time.Duration(round) * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := event.EnsureStream(ctx, js[0], nil, n, event.KindResult, settings)
		cancel()
		if err != nil {
			t.Errorf("beside another instance's create: %v", err)
		}
	}
	n := event.Names{Cell: "ra"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	longer := settings
	longer.MaxAge = 48 * time.Hour
	st, err := event.EnsureStream(ctx, js[0], nil, n, event.KindWork, longer)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxAge; got != 48*time.Hour {
		t.Fatalf("a stream with another configuration is updated: max age %s, want 48h", got)
	}
}
