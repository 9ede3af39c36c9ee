// Package outbox publishes what a transaction wrote to the outbox table, so
// that a row change and the message it implies are never split: a crash
// between the two delays the message, it never loses it.
package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Msg builds an outbox row for v, carrying ctx's trace context in headers.
func Msg(ctx context.Context, subject, msgID string, v any) (store.OutboxMsg, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return store.OutboxMsg{}, err
	}
	h := nats.Header{}
	telemetry.Inject(ctx, h)
	hm := make(map[string]string, len(h))
	for k := range h {
		hm[k] = h.Get(k)
	}
	return store.OutboxMsg{Subject: subject, MsgID: msgID, Payload: payload, Headers: hm}, nil
}

// Relay drains the outbox into JetStream.
type Relay struct {
	Store *store.Store
	JS    jetstream.Publisher
	Log   *slog.Logger
	// Every is the poll period when nobody kicks. Default 250ms.
	Every time.Duration
	// Batch is how many rows one transaction publishes. Default 100.
	Batch int
	// Subjects limits the relay to subjects with these prefixes, the ones
	// its credential may publish. None means every subject.
	Subjects []string

	kick     chan struct{}
	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

// Start runs the relay until Stop or ctx ends.
func (r *Relay) Start(ctx context.Context) {
	if r.Every == 0 {
		r.Every = 250 * time.Millisecond
	}
	if r.Batch == 0 {
		r.Batch = 100
	}
	r.kick = make(chan struct{}, 1)
	r.done = make(chan struct{})
	ctx, r.cancel = context.WithCancel(ctx)
	go r.loop(ctx)
}

// Kick asks for a drain now, e.g. right after a commit that wrote rows.
func (r *Relay) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Stop ends the loop after one last drain and waits for it. Idempotent.
func (r *Relay) Stop() {
	r.stopOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
			<-r.done
		}
	})
}

func (r *Relay) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.Every)
	defer t.Stop()
	for {
		for {
			// A drain is never cut short by Stop: a transaction torn
			// mid-publish would keep its rows locked past the final drain.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			n, err := r.Drain(dctx)
			cancel()
			if err != nil {
				r.Log.Warn("outbox drain failed", "err", err)
				break
			}
			if n < r.Batch || ctx.Err() != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			// One last pass so that a clean stop leaves nothing behind.
			fin, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			if _, err := r.Drain(fin); err != nil {
				r.Log.Warn("final outbox drain failed", "err", err)
			}
			cancel()
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

// Drain publishes one batch and returns how many were published.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	batch := r.Batch
	if batch <= 0 {
		batch = 100
	}
	return r.Store.DrainOutbox(ctx, batch, r.Subjects, func(msgs []store.OutboxMsg) (int, error) {
		for i, m := range msgs {
			nm := &nats.Msg{Subject: m.Subject, Data: m.Payload, Header: nats.Header{}}
			for k, v := range m.Headers {
				nm.Header.Set(k, v)
			}
			if _, err := r.JS.PublishMsg(ctx, nm, jetstream.WithMsgID(m.MsgID)); err != nil {
				return i, err
			}
		}
		return len(msgs), nil
	})
}
