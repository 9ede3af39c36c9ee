// Package lifecycle gives every long-running part of a service the same
// shape: Start backgrounds the part and returns once it runs, Stop ends it,
// waits for it, and may be called twice or on a part that never started.
// A part runs until it is stopped, not until the context it was started
// with ends, so that a process can stop its parts in order (stop taking
// work, finish what is held, flush outboxes) after its signal arrived.
package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// ErrStop is the cause of the context a part runs under once Stop is
// called, so a log can tell a controlled stop from a failure.
var ErrStop = errors.New("lifecycle: stopped")

// Service is one long-running part.
type Service interface {
	// Start backgrounds the part; the error says it could not start.
	Start(ctx context.Context) error
	// Stop ends the part and waits for it until ctx ends. Idempotent.
	Stop(ctx context.Context)
}

// Runner runs one background goroutine for a part. The zero value is ready.
type Runner struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelCauseFunc
	done    chan struct{}
}

// ErrStarted is returned by Go on a Runner that already ran.
var ErrStarted = errors.New("lifecycle: already started")

// Go runs run in the background with a context that keeps ctx's values and
// is canceled, with cause ErrStop, only by Stop.
func (r *Runner) Go(ctx context.Context, run func(ctx context.Context)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return ErrStarted
	}
	r.started = true
	ctx, r.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		run(ctx)
	}()
	return nil
}

// Stop cancels the run and waits for it to return, or for ctx to end.
// It does nothing on a Runner that never ran.
func (r *Runner) Stop(ctx context.Context) {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel(ErrStop)
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Done is closed when the run has returned; nil before Go.
func (r *Runner) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// Ticker runs a pass of periodic work every Every, at once when kicked,
// and again at once while a pass says there is more. The sweeper, the
// ledger's reaper and every outbox relay are Tickers.
type Ticker struct {
	// Name says which part failed, in logs.
	Name string
	// Every is the period. Required.
	Every time.Duration
	// Pass does one pass. more asks for another pass at once (a full
	// batch). A pass is not cut short by Stop: it runs under a context
	// bounded only by PassTimeout, so a transaction is never torn mid-way.
	Pass func(ctx context.Context) (more bool, err error)
	// PassTimeout bounds one pass. Default 10s.
	PassTimeout time.Duration
	// Final runs one last pass when the Ticker stops, so that a clean stop
	// leaves nothing behind.
	Final bool
	// Log records failed passes. Default slog.Default().
	Log *slog.Logger

	run      Runner
	kickOnce sync.Once
	kick     chan struct{}
}

func (t *Ticker) kicks() chan struct{} {
	t.kickOnce.Do(func() { t.kick = make(chan struct{}, 1) })
	return t.kick
}

// Start runs the Ticker until Stop.
func (t *Ticker) Start(ctx context.Context) error {
	if t.Every <= 0 || t.Pass == nil {
		return errors.New("lifecycle: ticker " + t.Name + " needs Every and Pass")
	}
	if t.PassTimeout <= 0 {
		t.PassTimeout = 10 * time.Second
	}
	if t.Log == nil {
		t.Log = slog.Default()
	}
	kick := t.kicks()
	return t.run.Go(ctx, func(ctx context.Context) {
		tick := time.NewTicker(t.Every)
		defer tick.Stop()
		for {
			t.passes(ctx)
			select {
			case <-ctx.Done():
				if t.Final {
					t.once(ctx)
				}
				return
			case <-kick:
			case <-tick.C:
			}
		}
	})
}

// passes runs passes while they say there is more and the Ticker runs.
func (t *Ticker) passes(ctx context.Context) {
	for t.once(ctx) && ctx.Err() == nil {
	}
}

// once runs one pass and reports whether another is wanted at once.
func (t *Ticker) once(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.PassTimeout)
	defer cancel()
	more, err := t.Pass(pctx)
	if err != nil {
		t.Log.Warn(t.Name+" pass failed", "err", err)
		return false
	}
	return more
}

// Kick asks for a pass now; it never blocks.
func (t *Ticker) Kick() {
	select {
	case t.kicks() <- struct{}{}:
	default:
	}
}

// Stop ends the Ticker after the pass under way (and the final pass) and
// waits for it until ctx ends. Idempotent.
func (t *Ticker) Stop(ctx context.Context) { t.run.Stop(ctx) }

// StartAll starts the services in order; when one fails, those already
// started are stopped, last first, and its error is returned.
func StartAll(ctx context.Context, services ...Service) error {
	for i, s := range services {
		if err := s.Start(ctx); err != nil {
			for j := i - 1; j >= 0; j-- {
				services[j].Stop(context.WithoutCancel(ctx))
			}
			return err
		}
	}
	return nil
}

// StopAll stops the services one after the other, in the order given: a
// process stops taking work before it stops what finishes work.
func StopAll(ctx context.Context, services ...Service) {
	for _, s := range services {
		s.Stop(ctx)
	}
}

// StopAllParallel stops the services at once and waits for all of them.
func StopAllParallel(ctx context.Context, services ...Service) {
	var wg sync.WaitGroup
	for _, s := range services {
		wg.Go(func() { s.Stop(ctx) })
	}
	wg.Wait()
}
