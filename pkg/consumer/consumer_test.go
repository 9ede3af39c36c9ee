package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var names = event.Names{Cell: "us"}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func connect(t *testing.T) jetstream.JetStream {
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
	return js
}

func publish(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		if _, err := js.Publish(context.Background(), names.Work(event.Interactive, "acme"), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
}

func setup(t *testing.T, n int) jetstream.JetStream {
	t.Helper()
	js := connect(t)
	if _, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	publish(t, js, n)
	return js
}

func start(t *testing.T, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	if cfg.Stream == "" {
		cfg.Stream = names.Stream(event.KindWork)
	}
	if cfg.Durable.Durable == "" {
		cfg.Durable = event.ConsumerSettings{Durable: "test", AckWait: 30 * time.Second}
	}
	cfg.Log = quiet()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	return c
}

// No more than the concurrency limit is ever in hand, and every message
// is handled and acknowledged.
func TestConcurrencyIsBounded(t *testing.T) {
	t.Parallel()
	js := setup(t, 40)
	var inHand, peak, handled atomic.Int64
	done := make(chan struct{})
	start(t, consumer.Config{JS: js, Concurrency: 3, Handle: func(ctx context.Context, msg jetstream.Msg) consumer.Disposition {
		n := inHand.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		inHand.Add(-1)
		if handled.Add(1) == 40 {
			close(done)
		}
		return consumer.Done()
	}})
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("handled %d of 40", handled.Load())
	}
	if p := peak.Load(); p > 3 || p < 1 {
		t.Errorf("peak in hand = %d, want 1..3", p)
	}
	waitAcked(t, js, "test", 40)
}

func waitAcked(t *testing.T, js jetstream.JetStream, durable string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := js.Consumer(context.Background(), names.Stream(event.KindWork), durable)
		if err == nil && info.CachedInfo().AckFloor.Stream >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ack floor of %s never reached %d (err %v)", durable, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop waits for the messages in hand; when its context ends first it
// cancels them, and still returns only after their handlers did.
func TestStopWaitsThenCancels(t *testing.T) {
	t.Parallel()
	js := setup(t, 2)
	started := make(chan struct{}, 2)
	var mu sync.Mutex
	var ended []string
	c := start(t, consumer.Config{JS: js, Concurrency: 2, Handle: func(ctx context.Context, msg jetstream.Msg) consumer.Disposition {
		started <- struct{}{}
		<-ctx.Done() // a handler that only ends when told to
		mu.Lock()
		ended = append(ended, string(msg.Data()))
		mu.Unlock()
		return consumer.Retry(0)
	}})
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c.Stop(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 2 {
		t.Fatalf("Stop returned with %d of 2 handlers finished", len(ended))
	}
	c.Stop(context.Background()) // idempotent
}

// tries counts the consumer's tries to create its durable.
type tries struct {
	jetstream.JetStream
	n atomic.Int64
}

func (t *tries) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	defer t.n.Add(1)
	return t.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
}

// A consumer whose stream does not exist yet waits for it, not ready, and
// consumes once its owner created it.
func TestWaitsForTheStream(t *testing.T) {
	t.Parallel()
	js := &tries{JetStream: connect(t)}
	got := make(chan string, 1)
	c := start(t, consumer.Config{JS: js, RetryEvery: 20 * time.Millisecond,
		Handle: func(ctx context.Context, msg jetstream.Msg) consumer.Disposition {
			got <- string(msg.Data())
			return consumer.Done()
		}})
	// Not ready after it tried, and found no stream, more than once.
	for deadline := time.Now().Add(30 * time.Second); js.n.Load() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d tries to create the durable in 30s, want 3", js.n.Load())
		}
	}
	if err := c.Ready(context.Background()); err == nil {
		t.Fatal("Ready while the stream does not exist")
	}
	if _, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	publish(t, js, 1)
	select {
	case v := <-got:
		if v != "0" {
			t.Fatalf("got %q", v)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing consumed after the stream appeared")
	}
	if err := c.Ready(context.Background()); err != nil {
		t.Fatalf("Ready after consuming: %v", err)
	}
}

// A durable the server lost is created again and consumption goes on.
func TestDurableDeletedIsCreatedAgain(t *testing.T) {
	t.Parallel()
	js := setup(t, 1)
	var handled atomic.Int64
	c := start(t, consumer.Config{JS: js, RetryEvery: 20 * time.Millisecond, ReadyGrace: 50 * time.Millisecond,
		Handle: func(ctx context.Context, msg jetstream.Msg) consumer.Disposition {
			handled.Add(1)
			return consumer.Done()
		}})
	waitAcked(t, js, "test", 1)
	// The stream lost with the broker's store takes its durable along.
	if err := js.DeleteStream(context.Background(), names.Stream(event.KindWork)); err != nil {
		t.Fatal(err)
	}
	// Ready counts the grace from when the durable was first seen missing
	// (by Ready itself, or by the consumer told of the deletion): asked
	// until then and past it, it must say so.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := c.Ready(context.Background())
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready says %v 30s after the durable went missing, with a grace of 50ms", err)
		}
	}
	if _, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for c.Ready(context.Background()) != nil || handled.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("durable not back in 20s (handled %d; ready: %v)", handled.Load(), c.Ready(context.Background()))
		}
		publish(t, js, 1)
		time.Sleep(100 * time.Millisecond)
	}
}

type payload struct{ N int }

// Typed terminates a message that does not decode, logs why, and settles
// the rest as the process function says.
func TestTypedSettlesAsDecided(t *testing.T) {
	t.Parallel()
	js := connect(t)
	if _, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"1", "not a number", "2"} {
		if _, err := js.Publish(context.Background(), names.Work(event.Interactive, "acme"), []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	var logged strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logged}, nil))
	decode := func(b []byte) (payload, error) {
		var n int
		if _, err := fmt.Sscan(string(b), &n); err != nil {
			return payload{}, errors.New("not a number")
		}
		return payload{n}, nil
	}
	seen := make(chan int, 10)
	var naked atomic.Bool
	start(t, consumer.Config{JS: js, Handle: consumer.Typed(log, decode,
		func(ctx context.Context, p payload, d consumer.Delivery) consumer.Disposition {
			seen <- p.N
			if p.N == 2 && naked.CompareAndSwap(false, true) {
				return consumer.Retry(10 * time.Millisecond)
			}
			return consumer.Done()
		})})
	var got []int
	for len(got) < 3 {
		select {
		case n := <-seen:
			got = append(got, n)
		case <-time.After(30 * time.Second):
			t.Fatalf("handled %v", got)
		}
	}
	if fmt.Sprint(got) != "[1 2 2]" {
		t.Fatalf("handled %v, want [1 2 2] (2 retried once, the bad payload never handed over)", got)
	}
	waitAcked(t, js, "test", 3)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), `"outcome":"refused"`) || !strings.Contains(logged.String(), "not a number") {
		t.Fatalf("the refusal was not logged as a decision: %s", logged.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// The broker loses its store and comes back empty on the same address: the
// stream's owner creates the stream again (here the test), and the
// consumer, which the new server answers with silence rather than
// "deleted", notices and creates its durable again. Nothing restarts.
func TestBrokerLostItsStore(t *testing.T) {
	t.Parallel()
	first, err := testenv.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	port := first.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(first.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	publish(t, js, 1)
	var handled atomic.Int64
	start(t, consumer.Config{JS: js, RetryEvery: 50 * time.Millisecond,
		Handle: func(ctx context.Context, msg jetstream.Msg) consumer.Disposition {
			handled.Add(1)
			return consumer.Done()
		}})
	waitAcked(t, js, "test", 1)

	first.Shutdown()
	first.WaitForShutdown()
	second, err := testenv.StartNATSOn(t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Shutdown(); second.WaitForShutdown() })
	deadline := time.Now().Add(30 * time.Second)
	for !nc.IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("the client never reconnected")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The owner creates its stream again (its keeper tries until the new
	// server's JetStream answers).
	for {
		_, err := event.EnsureStream(context.Background(), js, nil, names, event.KindWork, event.StreamSettings{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for handled.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing consumed after the broker lost its store (handled %d)", handled.Load())
		}
		publish(t, js, 1)
		time.Sleep(200 * time.Millisecond)
	}
}
