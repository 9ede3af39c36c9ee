package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/devkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func setup(t *testing.T, n int) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := event.EnsureStream(ctx, js, event.KindWork, "us", event.StreamSettings{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, event.WorkSubject("us", event.Interactive, "acme"), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := event.EnsureConsumer(ctx, st, event.ConsumerSettings{Durable: "test", AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// No more than the concurrency limit is ever in hand, and every message
// is handled.
func TestConcurrencyIsBounded(t *testing.T) {
	t.Parallel()
	cons := setup(t, 40)
	var inHand, peak, handled atomic.Int64
	done := make(chan struct{})
	l, err := consumer.Start(context.Background(), cons, 3, func(ctx context.Context, msg jetstream.Msg) {
		n := inHand.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		inHand.Add(-1)
		_ = msg.Ack()
		if handled.Add(1) == 40 {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Stop(context.Background())
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("handled %d of 40", handled.Load())
	}
	if p := peak.Load(); p > 3 || p < 1 {
		t.Errorf("peak in hand = %d, want 1..3", p)
	}
}

// Stop waits for the messages in hand; when its context ends first it
// cancels them, and still returns only after their handlers did.
func TestStopWaitsThenCancels(t *testing.T) {
	t.Parallel()
	cons := setup(t, 2)
	started := make(chan struct{}, 2)
	var mu sync.Mutex
	var ended []string
	l, err := consumer.Start(context.Background(), cons, 2, func(ctx context.Context, msg jetstream.Msg) {
		started <- struct{}{}
		<-ctx.Done() // a handler that only ends when told to
		mu.Lock()
		ended = append(ended, string(msg.Data()))
		mu.Unlock()
		_ = msg.Nak()
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	l.Stop(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 2 {
		t.Fatalf("Stop returned with %d of 2 handlers finished", len(ended))
	}
	l.Stop(context.Background()) // idempotent
}
