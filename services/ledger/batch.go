package ledger

import (
	"context"
	"sync"

	"assay.dev/pkg/store"
)

// batcher records the rows of concurrent deliveries together: a row that
// arrives while a batch is being written joins the next one, so under load
// many attempts share one commit, and alone a row waits for nobody.
type batcher struct {
	st  Store
	max int

	mu       sync.Mutex
	queue    []*pending
	flushing bool
}

type pending struct {
	row  store.LedgerRow
	done chan store.LedgerResult
}

// record records row, in whichever batch it joins, and says what that did.
func (b *batcher) record(ctx context.Context, row store.LedgerRow) store.LedgerResult {
	p := &pending{row: row, done: make(chan store.LedgerResult, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	lead := !b.flushing
	b.flushing = true
	b.mu.Unlock()
	if lead {
		// The first to find no batch under way writes batches until the
		// queue is empty; the others wait for theirs.
		b.flush(context.WithoutCancel(ctx))
	}
	return <-p.done
}

func (b *batcher) flush(ctx context.Context) {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		if n == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		rows := make([]store.LedgerRow, n)
		for i, p := range batch {
			rows[i] = p.row
		}
		for i, r := range b.st.RecordLedgerBatch(ctx, rows) {
			batch[i].done <- r
		}
	}
}
