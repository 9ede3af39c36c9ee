// Package consumer runs a service's durable JetStream consumer: at most a set
// number of messages in hand at once, and an orderly stop that finishes what
// is in hand before the service closes its pools.
package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler processes one message and settles it (ack, nak or term). ctx ends
// only when Stop gives up waiting.
type Handler func(ctx context.Context, msg jetstream.Msg)

// Loop is a running consumer.
type Loop struct {
	enter    Gate
	inflight sync.WaitGroup
	cc       jetstream.ConsumeContext
	cancel   context.CancelFunc
	halt     context.CancelFunc
	stopOnce sync.Once
}

// Gate admits one message into hand and returns what gives its place back.
// It may wait; it fails only when ctx ends.
type Gate func(ctx context.Context) (leave func(), err error)

// Start consumes from cons, handing each message to h on its own goroutine,
// with at most concurrency in hand. Messages beyond that wait in JetStream,
// not in memory.
func Start(ctx context.Context, cons jetstream.Consumer, concurrency int, h Handler, opts ...Option) (*Loop, error) {
	if concurrency < 1 {
		concurrency = 1
	}
	sem := make(chan struct{}, concurrency)
	gate := func(ctx context.Context) (func(), error) {
		select {
		case sem <- struct{}{}:
			return func() { <-sem }, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return StartGated(ctx, cons, concurrency, gate, h, opts...)
}

// Option adjusts a Loop.
type Option func(*options)

type options struct {
	log *slog.Logger
}

// WithLog logs what goes wrong with the pull subscription itself (missed
// heartbeats, a deleted consumer), which no handler sees.
func WithLog(log *slog.Logger) Option { return func(o *options) { o.log = log } }

// StartGated is Start with a gate deciding how many messages are in hand,
// e.g. an adaptive limit. pull bounds the messages buffered from the server
// while the gate is closed; keep it small, their ack wait is running.
func StartGated(ctx context.Context, cons jetstream.Consumer, pull int, enter Gate, h Handler, opts ...Option) (*Loop, error) {
	if pull < 1 {
		pull = 1
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	consumeOpts := []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(pull)}
	if o.log != nil {
		consumeOpts = append(consumeOpts, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			o.log.Warn("consumer: pull subscription", "consumer", cons.CachedInfo().Name, "err", err)
		}))
	}
	l := &Loop{enter: enter}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	haltCtx, halt := context.WithCancel(runCtx)
	l.cancel, l.halt = cancel, halt
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		leave, err := l.enter(haltCtx)
		if err != nil {
			// Stopping: hand the message back for another instance.
			_ = msg.Nak()
			return
		}
		l.inflight.Add(1)
		go func() {
			defer func() { leave(); l.inflight.Done() }()
			h(runCtx, msg)
		}()
	}, consumeOpts...)
	if err != nil {
		halt()
		cancel()
		return nil, fmt.Errorf("consumer: %w", err)
	}
	l.cc = cc
	return l, nil
}

// Stop stops taking messages and waits for those in hand; when ctx ends
// first it cancels them (their handlers release what they hold) and waits
// for them to return. Idempotent.
func (l *Loop) Stop(ctx context.Context) {
	l.stopOnce.Do(func() {
		l.cc.Stop()
		l.halt()
		done := make(chan struct{})
		go func() { l.inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			l.cancel()
			<-done
		}
		l.cancel()
	})
}

// Ready reports whether a service's database answers and its durable
// consumer exists.
func Ready(ctx context.Context, pool *pgxpool.Pool, js jetstream.StreamConsumerManager, stream, durable string) error {
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if _, err := js.Consumer(ctx, stream, durable); err != nil {
		return fmt.Errorf("jetstream: consumer %s on %s: %w", durable, stream, err)
	}
	return nil
}
