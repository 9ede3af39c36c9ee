// Package consumer runs a service's durable JetStream consumer as one
// lifecycle part: it creates the durable once the stream it reads exists
// (the stream belongs to the service that publishes to it, which may start
// later), keeps at most a set number of messages in hand, settles each as
// its handler decides, creates the durable again when the server lost it,
// and stops in order: no new messages, then the ones in hand finished.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/telemetry"
)

// Settle is how a message is settled.
type Settle int

// Settlements.
const (
	// Ack: done with it.
	Ack Settle = iota
	// Nak: deliver it again after Delay.
	Nak
	// Term: never deliver it again.
	Term
)

// Disposition is a handler's decision about its message.
type Disposition struct {
	Settle Settle
	Delay  time.Duration
}

// Done acknowledges the message.
func Done() Disposition { return Disposition{Settle: Ack} }

// Retry asks for the message again after delay.
func Retry(delay time.Duration) Disposition { return Disposition{Settle: Nak, Delay: delay} }

// Refuse terminates the message: no delivery of it can ever succeed.
func Refuse() Disposition { return Disposition{Settle: Term} }

// Delivery is what a handler may do with the message in hand besides
// deciding its disposition.
type Delivery interface {
	// InProgress tells the server the message is still being worked on.
	InProgress() error
	// Headers are the message's headers.
	Headers() nats.Header
}

// Handler handles one message and decides how it is settled.
type Handler func(ctx context.Context, msg jetstream.Msg) Disposition

// Typed is the one Handler of every assay consumer: it continues the
// message's trace, decodes its payload as a T (a payload that does not
// decode is terminated and the refusal logged as a decision), and settles
// the message as process decides.
func Typed[T any](log *slog.Logger, decode func([]byte) (T, error), process func(ctx context.Context, v T, d Delivery) Disposition) Handler {
	return func(ctx context.Context, msg jetstream.Msg) Disposition {
		ctx = telemetry.Extract(ctx, msg.Headers())
		v, err := decode(msg.Data())
		if err != nil {
			telemetry.Decision(ctx, log, msg.Subject(), "refused", "undecodable message: "+err.Error())
			return Refuse()
		}
		return process(ctx, v, msg)
	}
}

// Gate admits one message into hand and returns what gives its place back.
// It may wait; it fails only when ctx ends.
type Gate func(ctx context.Context) (leave func(), err error)

// Config configures a Consumer.
type Config struct {
	// JS reaches the stream.
	JS jetstream.StreamConsumerManager
	// Stream is the stream read.
	Stream string
	// Durable configures the durable pull consumer.
	Durable event.ConsumerSettings
	// Concurrency bounds the messages in hand when Gate is nil. Default 1.
	Concurrency int
	// Gate, when set, admits each message into hand instead of
	// Concurrency (an adaptive limit). Pull then bounds the messages
	// buffered from the server while the gate is closed; keep it small,
	// their ack wait is running. Default 2.
	Gate Gate
	Pull int
	// Handle handles each message. Required.
	Handle Handler
	// Log records what goes wrong with the subscription itself (missed
	// heartbeats, a deleted consumer), which no handler sees.
	Log *slog.Logger
	// RetryEvery is how long to wait before trying again to create the
	// durable, while the stream is missing or the server does not answer.
	// Default 1s.
	RetryEvery time.Duration
	// Heartbeat is how often the server says it still holds the
	// consumer's waiting pull request; after two heartbeats missed the
	// consumer pulls again. A pull request lives on the node that leads the
	// durable, and when that node dies the request goes with it, often
	// without a word; only the missed heartbeats tell. Default 2s; it must
	// stay below half the pull's 30s expiry.
	Heartbeat time.Duration
	// ReadyGrace is how long a durable the server lost may stay missing
	// while the consumer creates it again before Ready says so. Default
	// 10s.
	ReadyGrace time.Duration
	// Meter, when set, gets the durable's JetStream gauges (pending, ack
	// pending, redelivered, waiting, ack-floor lag), sampled from its
	// info every 5s and labelled with Labels and stream and consumer.
	Meter  metric.Meter
	Labels []attribute.KeyValue
}

// Consumer is a running durable consumer.
type Consumer struct {
	cfg  Config
	run  lifecycle.Runner
	gate Gate

	mu       sync.Mutex
	cc       jetstream.ConsumeContext
	lost     chan struct{}           // closed when the server lost the consumer
	consumed bool                    // the durable existed and was consumed once
	missing  time.Time               // since when the durable is known missing
	stopping bool                    // Stop waits for the messages in hand: no more are taken
	info     *jetstream.ConsumerInfo // the last sample of the durable, nil before one
	inflight sync.WaitGroup
	// halt ends waits at the gate when Stop begins; work ends handlers
	// only when Stop gives up waiting for them.
	halt, work           context.Context
	haltCancel, workStop context.CancelFunc
}

// New checks the config.
func New(cfg Config) (*Consumer, error) {
	if cfg.Stream == "" || cfg.Durable.Durable == "" || cfg.Handle == nil {
		return nil, errors.New("consumer: Stream, Durable.Durable and Handle are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = time.Second
	}
	if cfg.ReadyGrace <= 0 {
		cfg.ReadyGrace = 10 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	c := &Consumer{cfg: cfg, gate: cfg.Gate}
	if c.gate == nil {
		if cfg.Concurrency < 1 {
			cfg.Concurrency = 1
		}
		c.cfg.Pull = cfg.Concurrency
		sem := make(chan struct{}, cfg.Concurrency)
		c.gate = func(ctx context.Context) (func(), error) {
			select {
			case sem <- struct{}{}:
				return func() { <-sem }, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	} else if c.cfg.Pull < 1 {
		c.cfg.Pull = 2
	}
	if cfg.Meter != nil {
		if err := c.gauges(cfg.Meter); err != nil {
			return nil, fmt.Errorf("consumer %s: gauges: %w", cfg.Durable.Durable, err)
		}
	}
	return c, nil
}

// Start creates the durable and consumes, in the background: when the
// stream does not exist yet, it tries again every RetryEvery until it
// does, and Ready reports the wait.
func (c *Consumer) Start(ctx context.Context) error {
	if c.cfg.JS == nil {
		return errors.New("consumer: " + c.cfg.Durable.Durable + " has no JetStream to consume from")
	}
	// Under mu, so that a Stop racing Start sees both contexts or neither.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.haltCancel != nil {
		return lifecycle.ErrStarted
	}
	c.work, c.workStop = context.WithCancel(context.WithoutCancel(ctx))
	c.halt, c.haltCancel = context.WithCancel(c.work)
	return c.run.Go(ctx, c.loop)
}

func (c *Consumer) loop(ctx context.Context) {
	defer c.unsubscribe()
	// A broker that lost its store and came back answers a pull for a
	// durable it no longer has with silence (no responders, missed
	// heartbeats), not with "deleted": the durable is looked at too.
	check := time.NewTicker(5 * time.Second)
	defer check.Stop()
	for {
		lost, err := c.subscribe(ctx)
		if err != nil {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				c.cfg.Log.Warn("consumer: cannot consume yet; trying again", "consumer", c.cfg.Durable.Durable,
					"stream", c.cfg.Stream, "err", err, "retry_in", c.cfg.RetryEvery.String())
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(c.cfg.RetryEvery):
			}
			continue
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-check.C:
				if !c.gone(ctx) {
					continue
				}
			case <-lost:
			}
			break wait
		}
		c.cfg.Log.Warn("consumer: the server lost the durable; creating it again",
			"consumer", c.cfg.Durable.Durable, "stream", c.cfg.Stream)
		c.markMissing()
		c.unsubscribe()
	}
}

// gone reports whether the server says the durable (or its stream) does
// not exist.
func (c *Consumer) gone(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := c.cfg.JS.Consumer(ctx, c.cfg.Stream, c.cfg.Durable.Durable)
	if err == nil {
		c.mu.Lock()
		c.info = cons.CachedInfo()
		c.mu.Unlock()
	}
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// gauges registers the durable's JetStream gauges on meter.
func (c *Consumer) gauges(meter metric.Meter) error {
	attrs := metric.WithAttributes(append(append([]attribute.KeyValue(nil), c.cfg.Labels...),
		attribute.String("stream", c.cfg.Stream), attribute.String("consumer", c.cfg.Durable.Durable))...)
	var errs []error
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	pending := gauge("assay_jetstream_consumer_pending", "messages of the stream the durable has not delivered yet")
	ackPending := gauge("assay_jetstream_consumer_ack_pending", "messages delivered and not yet acknowledged")
	redelivered := gauge("assay_jetstream_consumer_redelivered", "messages delivered more than once and not yet acknowledged")
	waiting := gauge("assay_jetstream_consumer_waiting", "pull requests waiting at the server")
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.mu.Lock()
		info := c.info
		c.mu.Unlock()
		if info == nil {
			return nil
		}
		o.ObserveInt64(pending, int64(info.NumPending), attrs)
		o.ObserveInt64(ackPending, int64(info.NumAckPending), attrs)
		o.ObserveInt64(redelivered, int64(info.NumRedelivered), attrs)
		o.ObserveInt64(waiting, int64(info.NumWaiting), attrs)
		return nil
	}, pending, ackPending, redelivered, waiting)
	return err
}

// subscribe creates (or updates) the durable and starts consuming it.
func (c *Consumer) subscribe(ctx context.Context) (<-chan struct{}, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cons, err := c.cfg.JS.CreateOrUpdateConsumer(cctx, c.cfg.Stream, event.ConsumerConfig(c.cfg.Durable))
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", c.cfg.Durable.Durable, c.cfg.Stream, err)
	}
	lost := make(chan struct{})
	var lostOnce sync.Once
	// Held until the subscription is recorded: a message can be handed to
	// the handler as soon as Consume starts, and Ready must not then say
	// the durable is not consumed yet.
	c.mu.Lock()
	defer c.mu.Unlock()
	cc, err := cons.Consume(c.receive, jetstream.PullMaxMessages(c.cfg.Pull), jetstream.PullHeartbeat(c.cfg.Heartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				lostOnce.Do(func() { close(lost) })
				return
			}
			c.cfg.Log.Warn("consumer: pull subscription", "consumer", c.cfg.Durable.Durable, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", c.cfg.Durable.Durable, c.cfg.Stream, err)
	}
	first := !c.consumed
	c.cc, c.lost, c.consumed, c.missing, c.info = cc, lost, true, time.Time{}, cons.CachedInfo()
	if first {
		c.cfg.Log.Info("consumer ensured", "consumer", c.cfg.Durable.Durable, "stream", c.cfg.Stream,
			"filter", c.cfg.Durable.Filter, "ack_wait", event.ConsumerConfig(c.cfg.Durable).AckWait.String())
	}
	return lost, nil
}

func (c *Consumer) unsubscribe() {
	c.mu.Lock()
	cc := c.cc
	c.cc = nil
	c.mu.Unlock()
	if cc != nil {
		cc.Stop()
	}
}

// receive takes one message into hand, on its own goroutine, once the gate
// admits it.
func (c *Consumer) receive(msg jetstream.Msg) {
	leave, err := c.gate(c.halt)
	if err != nil {
		// Stopping: hand the message back for another instance.
		_ = msg.Nak()
		return
	}
	// The subscription may deliver one more message while Stop waits; it
	// goes back rather than joining what Stop waits for.
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		leave()
		_ = msg.Nak()
		return
	}
	c.inflight.Add(1)
	c.mu.Unlock()
	go func() {
		defer func() { leave(); c.inflight.Done() }()
		d := c.cfg.Handle(c.work, msg)
		var err error
		switch d.Settle {
		case Ack:
			err = msg.Ack()
		case Nak:
			err = msg.NakWithDelay(d.Delay)
		case Term:
			err = msg.Term()
		}
		if err != nil {
			c.cfg.Log.Warn("consumer: settling a message failed", "consumer", c.cfg.Durable.Durable,
				"subject", msg.Subject(), "err", err)
		}
	}()
}

// Stop stops taking messages and waits for those in hand; when ctx ends
// first it cancels them (their handlers release what they hold) and waits
// for them to return. Idempotent; a Consumer never started is a no-op.
func (c *Consumer) Stop(ctx context.Context) {
	c.mu.Lock()
	haltCancel, workStop := c.haltCancel, c.workStop
	c.mu.Unlock()
	if haltCancel == nil {
		return
	}
	haltCancel()
	c.run.Stop(ctx)
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { c.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		workStop()
		<-done
	}
	workStop()
}

func (c *Consumer) markMissing() {
	c.mu.Lock()
	if c.missing.IsZero() {
		c.missing = time.Now()
	}
	c.mu.Unlock()
}

// Ready reports whether the durable exists and is being consumed. Before
// it was consumed once it is not ready; after that a durable the server
// lost is still ready for ReadyGrace while it is created again.
func (c *Consumer) Ready(ctx context.Context) error {
	c.mu.Lock()
	consumed := c.consumed
	c.mu.Unlock()
	if !consumed {
		return fmt.Errorf("consumer %s on %s: not consuming yet", c.cfg.Durable.Durable, c.cfg.Stream)
	}
	_, err := c.cfg.JS.Consumer(ctx, c.cfg.Stream, c.cfg.Durable.Durable)
	if err == nil {
		c.mu.Lock()
		c.missing = time.Time{}
		c.mu.Unlock()
		return nil
	}
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		c.markMissing()
		c.mu.Lock()
		since := c.missing
		c.mu.Unlock()
		if time.Since(since) < c.cfg.ReadyGrace {
			return nil
		}
		return fmt.Errorf("consumer %s on %s: missing for %s: %w", c.cfg.Durable.Durable, c.cfg.Stream,
			time.Since(since).Round(time.Second), err)
	}
	return fmt.Errorf("consumer %s on %s: %w", c.cfg.Durable.Durable, c.cfg.Stream, err)
}
