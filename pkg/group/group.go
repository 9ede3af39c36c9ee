// Package group runs what concurrent callers ask of the database together:
// group commit. A request that arrives while a group is being written
// joins the next one, so under load many requests share one statement and
// one commit. Alone a request waits for nobody, unless its Batch has a
// Wait: then a group not yet full gathers for at most that long first.
package group

import (
	"context"
	"sync"
	"time"
)

// DefaultMax bounds a group when Batch.Max is not set.
const DefaultMax = 64

// Batch gathers requests of type Req and runs them in groups. The zero
// value is not usable: Run is required.
type Batch[Req, Res any] struct {
	// Run runs one group and returns one result per request, in the
	// requests' order. It must decide each request on its own: one
	// request's fault is its result, never its group's.
	Run func(ctx context.Context, reqs []Req) []Res
	// Max bounds a group. Default DefaultMax.
	Max int
	// Flushers bounds the groups written at once (each holds a database
	// connection while it runs). Default 1.
	Flushers int
	// Wait is how long a group that is not full gathers requests before it
	// is written: a request waits at most this long for company. Zero (the
	// default) writes at once what has arrived, for a hop where each
	// request's latency is the caller's; a hop off the caller's path (the
	// ledger) trades a few milliseconds for fewer, larger statements.
	Wait time.Duration

	mu       sync.Mutex
	queue    []*call[Req, Res]
	flushing int
	full     chan struct{} // closed when the queue reaches a group's size while a flusher waits
}

type call[Req, Res any] struct {
	req  Req
	done chan Res
}

// Do runs req in whichever group it joins and returns its result. The
// group runs to its end even if ctx is canceled meanwhile: what it writes
// for the others must not be cut short by one caller.
func (b *Batch[Req, Res]) Do(ctx context.Context, req Req) Res {
	c := &call[Req, Res]{req: req, done: make(chan Res, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.full != nil && len(b.queue) >= b.limit() {
		close(b.full)
		b.full = nil
	}
	lead := b.flushing < max(b.Flushers, 1)
	if lead {
		b.flushing++
	}
	b.mu.Unlock()
	if lead {
		// The caller that finds a flusher's place free writes groups until
		// the queue is empty; the others wait for theirs.
		b.flush(context.WithoutCancel(ctx))
	}
	return <-c.done
}

func (b *Batch[Req, Res]) limit() int {
	if b.Max <= 0 {
		return DefaultMax
	}
	return b.Max
}

// gather waits, for at most Wait, until a group's worth of requests is
// queued.
func (b *Batch[Req, Res]) gather() {
	if b.Wait <= 0 {
		return
	}
	b.mu.Lock()
	if len(b.queue) >= b.limit() || b.full != nil {
		b.mu.Unlock()
		return
	}
	full := make(chan struct{})
	b.full = full
	b.mu.Unlock()
	t := time.NewTimer(b.Wait)
	select {
	case <-full:
	case <-t.C:
	}
	t.Stop()
	b.mu.Lock()
	if b.full == full {
		b.full = nil
	}
	b.mu.Unlock()
}

func (b *Batch[Req, Res]) flush(ctx context.Context) {
	limit := b.limit()
	for {
		b.gather()
		b.mu.Lock()
		n := min(len(b.queue), limit)
		if n == 0 {
			b.flushing--
			b.mu.Unlock()
			return
		}
		calls := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		reqs := make([]Req, n)
		for i, c := range calls {
			reqs[i] = c.req
		}
		res := b.Run(ctx, reqs)
		for i, c := range calls {
			c.done <- res[i]
		}
	}
}
