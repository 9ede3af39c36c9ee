package shed

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var errNotYet = errors.New("not running yet")

// cell is the test NATS server, with a classifier's capacity report in
// the capacity bucket of the cell names names.
type cell struct {
	js    jetstream.JetStream
	names event.Names
}

func lifecycleEnv(t *testing.T) *cell {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &cell{js: js, names: event.Names{Cell: "us"}}
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: c.names.CapacityBucket(),
		History: 1, TTL: time.Minute, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(admission.CapacityReport{Instance: "test", At: time.Now(), Every: time.Hour, Rate: 10, Limit: 4,
		Latency: 100 * time.Millisecond})
	if _, err := kv.Put(t.Context(), "classifier.test", b); err != nil {
		t.Fatal(err)
	}
	return c
}
