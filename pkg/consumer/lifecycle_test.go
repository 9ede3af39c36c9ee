package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
)

// TestConsumerLifecycle holds the consumer to the contract of every part,
// with messages to handle while it starts and stops.
func TestConsumerLifecycle(t *testing.T) {
	js := setup(t, 50)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		c, err := consumer.New(consumer.Config{JS: js, Stream: names.Stream(event.KindWork), Concurrency: 2, Log: quiet(),
			Durable: event.ConsumerSettings{Durable: "stress", AckWait: 30 * time.Second},
			Handle:  func(context.Context, jetstream.Msg) consumer.Disposition { return consumer.Done() }})
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}
