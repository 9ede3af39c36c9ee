// Package outbox publishes what a transaction wrote to the outbox table, so
// that a row change and the message it implies are never split: a crash
// between the two delays the message, it never loses it.
package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// Msg builds an outbox row for v, bound for the stream of kind stream
// (event.KindWork, …), carrying ctx's trace context in headers.
func Msg(ctx context.Context, stream, subject, msgID string, v any) (store.OutboxMsg, error) {
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
	return store.OutboxMsg{Stream: stream, Subject: subject, MsgID: msgID, Payload: payload, Headers: hm}, nil
}

// Source is where a relay finds the rows to publish.
type Source interface {
	DrainOutbox(ctx context.Context, limit int, streams []string, publish func([]store.OutboxMsg) (int, error)) (int, error)
}

// Relay drains the outbox into JetStream: a lifecycle part that publishes
// every Every, at once when kicked, and once more when it stops.
type Relay struct {
	Store Source
	JS    jetstream.Publisher
	Log   *slog.Logger
	// Streams are the kinds of stream this relay publishes to, the ones its
	// credential may publish to. Required.
	Streams []string
	// Every is the poll period when nobody kicks. Default 250ms.
	Every time.Duration
	// Batch is how many rows one transaction publishes. Default 100.
	Batch int

	ticker lifecycle.Ticker
}

// Start runs the relay until Stop.
func (r *Relay) Start(ctx context.Context) error {
	if r.Every == 0 {
		r.Every = 250 * time.Millisecond
	}
	t := &r.ticker
	t.Name, t.Every, t.Final, t.Log = "outbox relay", r.Every, true, r.Log
	t.Pass = func(ctx context.Context) (bool, error) {
		n, err := r.Drain(ctx)
		return n == r.batch(), err
	}
	return t.Start(ctx)
}

// Kick asks for a drain now, e.g. right after a commit that wrote rows.
func (r *Relay) Kick() { r.ticker.Kick() }

// Stop ends the relay after one last drain and waits for it. Idempotent.
func (r *Relay) Stop(ctx context.Context) { r.ticker.Stop(ctx) }

func (r *Relay) batch() int {
	if r.Batch <= 0 {
		return 100
	}
	return r.Batch
}

// Drain publishes one batch and returns how many were published.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	return r.Store.DrainOutbox(ctx, r.batch(), r.Streams, func(msgs []store.OutboxMsg) (int, error) {
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
