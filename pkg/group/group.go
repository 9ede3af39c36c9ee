// Package group runs what concurrent callers ask of the database together:
// group commit. A request that arrives while a group is being written
// joins the next one, so under load many requests share one statement and
// one commit, and alone a request waits for nobody — no timer, no linger.
package group

import (
	"context"
	"sync"
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

	mu       sync.Mutex
	queue    []*call[Req, Res]
	flushing int
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

func (b *Batch[Req, Res]) flush(ctx context.Context) {
	limit := b.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	for {
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
