package event

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamSettings are the knobs of a cell's streams.
type StreamSettings struct {
	// MaxAge bounds history kept for replay. Default 7 days.
	MaxAge time.Duration
	// Duplicates is the Nats-Msg-Id dedupe window. Default 2 minutes.
	Duplicates time.Duration
	// Replicas is 1 in dev, 3 in production clusters. Default 1.
	Replicas int
}

func (s StreamSettings) withDefaults() StreamSettings {
	if s.MaxAge == 0 {
		s.MaxAge = 7 * 24 * time.Hour
	}
	if s.Duplicates == 0 {
		s.Duplicates = 2 * time.Minute
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	return s
}

// EnsureStream creates or updates one of a cell's streams. Limits retention,
// not work-queue: history stays for replay until MaxAge.
func EnsureStream(ctx context.Context, js jetstream.StreamManager, kind, region string, s StreamSettings) (jetstream.Stream, error) {
	s = s.withDefaults()
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       StreamName(kind, region),
		Subjects:   []string{StreamSubjects(kind, region)},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		MaxAge:     s.MaxAge,
		Duplicates: s.Duplicates,
		Replicas:   s.Replicas,
		Discard:    jetstream.DiscardOld,
	})
	if err != nil {
		return nil, fmt.Errorf("event: stream %s: %w", StreamName(kind, region), err)
	}
	return st, nil
}

// ConsumerSettings configure a durable pull consumer.
type ConsumerSettings struct {
	Durable       string
	AckWait       time.Duration // default 30s
	MaxDeliver    int           // default 20
	MaxAckPending int           // default 64
	Filter        string        // default the whole stream
}

// EnsureConsumer creates or updates a durable pull consumer with explicit acks.
func EnsureConsumer(ctx context.Context, st jetstream.Stream, c ConsumerSettings) (jetstream.Consumer, error) {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 20
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 64
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		FilterSubject: c.Filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("event: consumer %s: %w", c.Durable, err)
	}
	return cons, nil
}
