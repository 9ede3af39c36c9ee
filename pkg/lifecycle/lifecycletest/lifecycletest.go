// Package lifecycletest drives any lifecycle.Service through the ways a
// process starts and stops its parts, so every implementation is held to
// the one contract: Start returns once the part runs, Stop ends it and
// waits, a second Stop and a Stop of a part never started return at once,
// and nothing a part ran is left running after its Stop.
package lifecycletest

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"assay.dev/pkg/lifecycle"
)

// StopWithin bounds one Stop. A part that needs longer is stuck: the
// longest drain in the services is 35 s of a real stop, and none of them
// holds work here.
const StopWithin = 30 * time.Second

// Stress runs each case on a fresh part from newPart; newPart builds it
// with everything it needs (its store, its NATS connection), made and
// cleaned up through t. Call it from a test that is not parallel: it
// counts the part's running goroutines, and a parallel test's parts would
// be counted too.
func Stress(t *testing.T, newPart func(t *testing.T) lifecycle.Service) {
	t.Helper()
	t.Run("StopNeverStarted", func(t *testing.T) {
		p := newPart(t)
		stop(t, p, "a Stop of a part never started")
		stop(t, p, "a second Stop of a part never started")
	})
	t.Run("StartThenStopTwice", func(t *testing.T) {
		p := newPart(t)
		before := running()
		start(t, p)
		stop(t, p, "Stop")
		stop(t, p, "a second Stop")
		settled(t, before)
	})
	t.Run("StopsAtOnce", func(t *testing.T) {
		p := newPart(t)
		before := running()
		start(t, p)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { stop(t, p, "one of eight Stops at once") })
		}
		wg.Wait()
		settled(t, before)
	})
	t.Run("StartRacesStop", func(t *testing.T) {
		// Either order is a process's right: whichever came first, a Stop
		// after both has the part stopped.
		p := newPart(t)
		before := running()
		var wg sync.WaitGroup
		wg.Go(func() { _ = p.Start(t.Context()) })
		wg.Go(func() { stop(t, p, "a Stop racing Start") })
		wg.Wait()
		stop(t, p, "the Stop after a race")
		settled(t, before)
	})
	t.Run("StartAfterStop", func(t *testing.T) {
		// A stopped part may refuse to start again or run again; either
		// way a Stop ends what it did.
		p := newPart(t)
		before := running()
		start(t, p)
		stop(t, p, "Stop")
		_ = p.Start(t.Context())
		stop(t, p, "the Stop after a second Start")
		settled(t, before)
	})
	t.Run("StartedContextEnds", func(t *testing.T) {
		// A part runs until Stop, not until the context it was started
		// with ends; Stop still ends it.
		p := newPart(t)
		before := running()
		ctx, cancel := context.WithCancel(t.Context())
		if err := p.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		cancel()
		stop(t, p, "Stop after the start context ended")
		settled(t, before)
	})
	t.Run("Cycles", func(t *testing.T) {
		before := running()
		for range 10 {
			p := newPart(t)
			start(t, p)
			stop(t, p, "Stop")
		}
		settled(t, before)
	})
}

func start(t *testing.T, p lifecycle.Service) {
	t.Helper()
	if err := p.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

// stop calls p.Stop and fails when it returned only because its deadline
// ended: Stop returns early then, with the part still running.
func stop(t *testing.T, p lifecycle.Service, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), StopWithin)
	defer cancel()
	p.Stop(ctx)
	if ctx.Err() != nil {
		t.Errorf("%s did not return within %s", what, StopWithin)
	}
}

// running counts the goroutines lifecycle.Runner started and that have not
// returned: every part runs its loop on one.
func running() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return bytes.Count(buf, []byte("assay.dev/pkg/lifecycle.(*Runner).Go.func"))
}

// settled fails unless the count of running part goroutines is back to
// before: a Stop that returned waited for the loop it ended. A loop that
// has returned may show in the stacks for a moment while its deferred
// calls finish, so the count is read again for up to a second.
func settled(t *testing.T, before int) {
	t.Helper()
	now := running()
	for deadline := time.Now().Add(time.Second); now > before && time.Now().Before(deadline); now = running() {
		time.Sleep(10 * time.Millisecond)
	}
	if now > before {
		t.Errorf("%d part goroutines still run after Stop returned (%d before Start)", now, before)
	}
}

// WarmWithin bounds how long a Warm part's Start waits for it to run.
const WarmWithin = 3 * time.Second

// Warm is part whose Start returns once ready says it runs, or after
// WarmWithin (a Start that lost a race with Stop may never run), so that
// the Stops of a Stress meet it running rather than still starting.
func Warm(part lifecycle.Service, ready func(ctx context.Context) error) lifecycle.Service {
	return warm{part, ready}
}

type warm struct {
	lifecycle.Service
	ready func(ctx context.Context) error
}

func (w warm) Start(ctx context.Context) error {
	if err := w.Service.Start(ctx); err != nil {
		return err
	}
	for end := time.Now().Add(WarmWithin); w.ready(ctx) != nil && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Pause is a hook a test puts in a part's start path (a wrapped
// dependency's method calls Enter): the first Enter says it was reached
// and then holds Start for For, so a Stop lands inside Start.
type Pause struct {
	For     time.Duration
	once    sync.Once
	entered chan struct{}
}

// NewPause is a Pause that holds Start for d.
func NewPause(d time.Duration) *Pause { return &Pause{For: d, entered: make(chan struct{})} }

// Enter marks the hook reached and, the first time, holds the caller.
func (p *Pause) Enter() {
	p.once.Do(func() {
		close(p.entered)
		time.Sleep(p.For)
	})
}

// StopWhileStarting is the StartRacesStop case held to one moment: Start
// runs until it reaches pause, Stop comes then, and a Stop after both must
// return with nothing of p left running. It is the race a Stress run meets
// only by chance.
func StopWhileStarting(t *testing.T, p lifecycle.Service, pause *Pause) {
	t.Helper()
	before := running()
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Start(t.Context()) })
	<-pause.entered
	p.Stop(t.Context())
	wg.Wait()
	stop(t, p, "the Stop after Start and Stop raced")
	settled(t, before)
}
