package event

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/lifecycle"
)

// StreamSettings are the knobs of a cell's streams. The zero value gives
// the defaults on each field.
type StreamSettings struct {
	// MaxAge bounds history kept for replay. Default 7 days.
	MaxAge time.Duration
	// Duplicates is the Nats-Msg-Id dedupe window. Default 2 minutes.
	Duplicates time.Duration
	// Replicas is 1 for a single server, 3 in a production cluster.
	// Default 1.
	Replicas int
	// Placement tags place the stream on servers carrying all of them,
	// e.g. a region's tag. Default none.
	Placement []string
	// Wait is how long creating or updating a stream or a bucket waits
	// out a JetStream cluster that is not ready (forming, electing a
	// leader, a node away), asking again with capped backoff. A negative
	// Wait tries once. Default DefaultWait; a service's is its
	// ASSAY_STARTUP_WAIT.
	Wait time.Duration
}

// WithDefaults is s with every unset field at its default: what a stream
// is created with.
func (s StreamSettings) WithDefaults() StreamSettings {
	if s.MaxAge == 0 {
		s.MaxAge = 7 * 24 * time.Hour
	}
	if s.Duplicates == 0 {
		s.Duplicates = 2 * time.Minute
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.Wait == 0 {
		s.Wait = DefaultWait
	}
	return s
}

// Once is s trying once: for a caller that asks again on its own (a
// ticker's next pass, the next request) rather than waiting in line.
func (s StreamSettings) Once() StreamSettings {
	s.Wait = -1
	return s
}

// StreamConfig is the configuration of the cell's stream of one kind.
// Limits retention, not work-queue: history stays for replay until MaxAge.
func StreamConfig(n Names, kind string, s StreamSettings) jetstream.StreamConfig {
	s = s.WithDefaults()
	cfg := jetstream.StreamConfig{
		Name:       n.Stream(kind),
		Subjects:   []string{n.Subjects(kind)},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		MaxAge:     s.MaxAge,
		Duplicates: s.Duplicates,
		Replicas:   s.Replicas,
		Discard:    jetstream.DiscardOld,
	}
	if len(s.Placement) > 0 {
		cfg.Placement = &jetstream.Placement{Tags: s.Placement}
	}
	return cfg
}

// EnsureStream creates or updates the cell's stream of one kind. Only the
// service that publishes to a stream creates it. A cluster that is not
// ready (see Unready) is waited out for up to s.Wait, or until ctx ends,
// logging each wait on log.
//
// On a cluster, the instances of a service starting together ensure the
// same replicated stream at once, and nats-server (2.15) leaves some of
// those requests unanswered: an update that meets another instance's
// create still in flight (and then that create too), and a second create
// with the same configuration proposed while the first is. So a stream
// that already has the configuration is left alone, a missing one is
// created rather than updated, and a request that goes unanswered is
// followed by another look: the stream the other instance made counts.
func EnsureStream(ctx context.Context, js jetstream.StreamManager, log *slog.Logger, n Names, kind string, s StreamSettings) (jetstream.Stream, error) {
	s = s.WithDefaults()
	cfg := StreamConfig(n, kind, s)
	var st jetstream.Stream
	err := Await(ctx, log, "stream "+cfg.Name, s.Wait, func(ctx context.Context) error {
		var err error
		st, err = ensureStream(ctx, js, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	return st, nil
}

func ensureStream(ctx context.Context, js jetstream.StreamManager, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile, otherwise.
			st, err = js.UpdateStream(ctx, cfg)
		}
	case err == nil && !sameStream(st.CachedInfo().Config, cfg):
		st, err = js.UpdateStream(ctx, cfg)
	}
	return st, err
}

// sameStream reports whether a stream's configuration has every setting
// StreamConfig makes.
func sameStream(have, want jetstream.StreamConfig) bool {
	tags := func(p *jetstream.Placement) []string {
		if p == nil {
			return nil
		}
		return p.Tags
	}
	return slices.Equal(have.Subjects, want.Subjects) && have.Retention == want.Retention &&
		have.Storage == want.Storage && have.MaxAge == want.MaxAge && have.Duplicates == want.Duplicates &&
		have.Replicas == want.Replicas && have.Discard == want.Discard && slices.Equal(tags(have.Placement), tags(want.Placement))
}

// ConsumerSettings configure a durable pull consumer.
type ConsumerSettings struct {
	Durable       string
	AckWait       time.Duration // default 30s
	MaxDeliver    int           // default 20
	MaxAckPending int           // default 64
	Filter        string        // default the whole stream
}

// ConsumerConfig is the configuration of a durable pull consumer with
// explicit acks.
func ConsumerConfig(c ConsumerSettings) jetstream.ConsumerConfig {
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 20
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 64
	}
	return jetstream.ConsumerConfig{
		Durable:       c.Durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.MaxDeliver,
		MaxAckPending: c.MaxAckPending,
		FilterSubject: c.Filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// Keeper keeps the streams a service owns in place: it creates them when
// the service starts and again whenever the broker has lost them (a store
// lost with its node), and says whether they exist. Only the service that
// publishes to a stream keeps it.
type Keeper struct {
	JS       jetstream.StreamManager
	Names    Names
	Kinds    []string
	Settings StreamSettings
	// Every is how often the streams are looked at. Default 5s.
	Every time.Duration
	Log   *slog.Logger
	// Meter, when set, gets each stream's messages and bytes as gauges,
	// sampled every Every and labelled with Region and stream.
	Meter  metric.Meter
	Region string

	ticker lifecycle.Ticker
	mu     sync.Mutex
	state  map[string]jetstream.StreamState
}

// Start creates the streams, then looks after them until Stop.
func (k *Keeper) Start(ctx context.Context) error {
	if k.Log == nil {
		k.Log = slog.Default()
	}
	for _, kind := range k.Kinds {
		if err := k.Ensure(ctx, kind); err != nil {
			return err
		}
		cfg := StreamConfig(k.Names, kind, k.Settings)
		k.Log.Info("stream ensured", "stream", cfg.Name, "subjects", strings.Join(cfg.Subjects, ","),
			"replicas", cfg.Replicas, "max_age", cfg.MaxAge.String())
	}
	if k.Every <= 0 {
		k.Every = 5 * time.Second
	}
	if k.Meter != nil {
		if err := k.gauges(); err != nil {
			return err
		}
	}
	t := &k.ticker
	t.Name, t.Every, t.Log = "stream keeper", k.Every, k.Log
	t.Pass = func(ctx context.Context) (bool, error) { return false, k.keep(ctx) }
	return t.Start(ctx)
}

// Stop ends the keeper. Idempotent.
func (k *Keeper) Stop(ctx context.Context) { k.ticker.Stop(ctx) }

// Ensure creates or updates the stream of kind.
func (k *Keeper) Ensure(ctx context.Context, kind string) error {
	_, err := EnsureStream(ctx, k.JS, k.Log, k.Names, kind, k.Settings)
	return err
}

// keep creates again every stream the broker no longer has.
func (k *Keeper) keep(ctx context.Context) error {
	var errs []error
	for _, kind := range k.Kinds {
		st, err := k.JS.Stream(ctx, k.Names.Stream(kind))
		if err == nil {
			k.mu.Lock()
			if k.state == nil {
				k.state = map[string]jetstream.StreamState{}
			}
			k.state[k.Names.Stream(kind)] = st.CachedInfo().State
			k.mu.Unlock()
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := k.Ensure(ctx, kind); err != nil {
			errs = append(errs, err)
			continue
		}
		k.Log.Warn("stream keeper: the broker had lost a stream; it is created again", "stream", k.Names.Stream(kind))
	}
	return errors.Join(errs...)
}

// gauges registers the streams' messages and bytes on the keeper's meter.
func (k *Keeper) gauges() error {
	msgs, err := k.Meter.Int64ObservableGauge("assay_jetstream_stream_messages", metric.WithDescription("messages the stream holds"))
	if err != nil {
		return err
	}
	size, err := k.Meter.Int64ObservableGauge("assay_jetstream_stream_bytes", metric.WithUnit("By"), metric.WithDescription("bytes the stream holds"))
	if err != nil {
		return err
	}
	_, err = k.Meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		k.mu.Lock()
		defer k.mu.Unlock()
		for name, st := range k.state {
			attrs := metric.WithAttributes(attribute.String("region", k.Region), attribute.String("stream", name))
			o.ObserveInt64(msgs, int64(st.Msgs), attrs)
			o.ObserveInt64(size, int64(st.Bytes), attrs)
		}
		return nil
	}, msgs, size)
	return err
}

// Ready reports whether every stream the keeper keeps exists.
func (k *Keeper) Ready(ctx context.Context) error {
	for _, kind := range k.Kinds {
		if _, err := k.JS.Stream(ctx, k.Names.Stream(kind)); err != nil {
			return fmt.Errorf("jetstream: stream %s: %w", k.Names.Stream(kind), err)
		}
	}
	return nil
}
