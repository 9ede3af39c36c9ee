// Package outbox publishes what a transaction wrote to the outbox table, so
// that a row change and the message it implies are never split: a crash
// between the two delays the message, it never loses it. A row that cannot
// be published is set aside after a bounded number of tries; it never holds
// up the rows behind it.
package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

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

// Source is where a relay finds the rows to publish, and where it marks
// those it was handed.
type Source interface {
	DrainOutbox(ctx context.Context, limit int, streams []string, olderThan time.Duration, policy store.SetAsidePolicy,
		publish func([]store.OutboxMsg) []store.Sent) (store.Drained, error)
	MarkPublished(ctx context.Context, sent []store.Published) (int64, error)
}

// Relay drains the outbox into JetStream: a lifecycle part that publishes
// every Every, at once when kicked, and once more when it stops.
//
// A process that knows which rows its transaction wrote hands them over
// with Send once it has committed: the relay publishes them at once,
// without reading them back, and marks them with the others sent since in
// one statement before its next poll. The poll leaves rows younger than
// handedGrace to those hand-offs, and still finds every row a hand-off did
// not publish (the process stopped, the broker refused): the poll is what
// makes the outbox reliable, a hand-off only makes it fast. A row sent but
// not yet marked when the process stops is sent again by the poll, and
// the broker keeps one copy of its id.
//
// A message handed over with no row (store.OutboxMsg.NoRow) is published
// the same way and never marked. One the broker does not take is tried
// again at the poll's pace for NoRowFor; past that, or when the process
// stops, it is counted (assay_outbox_unsent_total) and left to the state
// it announces: the sweeper announces queued work again, the reapers read
// back an attempt's or a commit's event.
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
	// MaxPayload is the largest message the broker takes (the
	// connection's MaxPayload); a larger row is set aside without a try.
	// 0: no check before publishing.
	MaxPayload int64
	// Ensure, when set, creates the stream of a kind again; the relay asks
	// it when the broker says no stream takes a row's subject (a stream
	// lost with the broker's store), then tries the row once more.
	Ensure func(ctx context.Context, stream string) error
	// SetAside bounds how long a failing row is tried.
	SetAside store.SetAsidePolicy
	// PublishTimeout bounds one publish's wait for the broker's ack.
	// Default 3s.
	PublishTimeout time.Duration
	// Meter counts set-aside rows (assay_outbox_set_aside). Optional.
	Meter metric.Meter
	// Region labels the count, as every series of a service is.
	Region string
	// NoRowFor is how long a message with no row is tried again after the
	// broker did not take it. Default 30s.
	NoRowFor time.Duration

	ticker   lifecycle.Ticker
	setAside metric.Int64Counter
	unsent   metric.Int64Counter
	once     sync.Once

	mu      sync.Mutex
	handed  []store.OutboxMsg // sent to the relay, not yet published
	kicked  bool              // a Kick asked for a poll of every waiting row
	polled  time.Time         // the last poll's start
	full    bool              // the last poll found a full batch: poll again
	sent    []store.Published // handed rows the broker took, not yet marked
	again   []rowless         // messages with no row the broker did not take
	handing atomic.Bool       // Send has been called: the poll leaves young rows to it
	final   atomic.Bool       // Stop was called: the poll takes every row
}

// rowless is a message with no row that waits to be tried again, since
// it was first handed over.
type rowless struct {
	msg   store.OutboxMsg
	since time.Time
}

// handedGrace is how old a row is before a relay that is handed rows
// polls for it: time enough for the process that wrote it to hand it over.
const handedGrace = time.Second

// maxHanded bounds the rows waiting for a hand-off; past it, rows are left
// to the poll (a broker that does not answer must not grow the process).
const maxHanded = 10000

// Start runs the relay until Stop.
func (r *Relay) Start(ctx context.Context) error {
	if r.Every == 0 {
		r.Every = 250 * time.Millisecond
	}
	if err := r.init(); err != nil {
		return err
	}
	// A Stop that came before this Start (the two may race) left the
	// relay final; it runs as any relay until its own Stop.
	r.final.Store(false)
	t := &r.ticker
	t.Name, t.Every, t.Final, t.Log = "outbox relay", r.Every, true, r.Log
	t.Pass = r.pass
	return t.Start(ctx)
}

// pass publishes what was handed over, then polls when a poll is due: at
// a Kick, at the end, or about a period after the last one (a pass the
// ticker runs on its own). A pass that only a Send asked for does not poll.
func (r *Relay) pass(ctx context.Context) (bool, error) {
	r.mu.Lock()
	handed, kicked := r.handed, r.kicked
	if len(handed) > r.batch()*4 {
		handed = handed[:r.batch()*4]
	}
	r.handed, r.kicked = r.handed[len(handed):], false
	r.mu.Unlock()
	if len(handed) > 0 {
		r.sendHanded(ctx, handed)
	}
	final := r.final.Load()
	due := kicked || final || r.full || time.Since(r.polled) >= r.Every/2
	if due || len(r.sent) >= r.batch()*4 {
		r.mark(ctx)
	}
	if !due {
		return r.waiting(), nil
	}
	r.tryAgain(ctx, final)
	r.polled = time.Now()
	var olderThan time.Duration
	if !kicked && !final && r.handing.Load() {
		olderThan = handedGrace
	}
	n, err := r.drain(ctx, olderThan)
	r.full = err == nil && n == r.batch()
	return r.full || r.waiting(), err
}

// waiting says rows were handed over that no pass has taken yet.
func (r *Relay) waiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handed) > 0
}

// Send hands over rows that a transaction of this process wrote and has
// committed, to be published at once without being read back. Rows the
// relay cannot publish now stay in the outbox for its poll.
func (r *Relay) Send(msgs ...store.OutboxMsg) {
	if len(msgs) == 0 {
		return
	}
	r.handing.Store(true)
	r.mu.Lock()
	if len(r.handed)+len(msgs) <= maxHanded {
		r.handed = append(r.handed, msgs...)
	}
	r.mu.Unlock()
	r.ticker.Kick()
}

// sendHanded publishes handed rows and keeps those the broker took to be
// marked. What it does not publish is the poll's.
func (r *Relay) sendHanded(ctx context.Context, msgs []store.OutboxMsg) {
	r.sendSince(ctx, msgs, nil)
}

// sendSince publishes msgs, each handed over at since[i] (now when since is
// nil), keeps the rows the broker took to be marked, and the messages with
// no row it did not take to be tried again.
func (r *Relay) sendSince(ctx context.Context, msgs []store.OutboxMsg, since []time.Time) {
	sent, stopped := r.publishAll(ctx, msgs)
	now, published := time.Now(), 0
	for i, m := range msgs {
		if i < len(sent) && sent[i].Err == nil {
			if !m.NoRow {
				r.sent = append(r.sent, store.Published{Stream: m.Stream, MsgID: m.MsgID, At: now})
			}
			published++
			continue
		}
		if m.NoRow {
			first := now
			if since != nil {
				first = since[i]
			}
			if len(r.again) >= maxHanded {
				r.countUnsent(ctx, m.Stream)
				continue
			}
			r.again = append(r.again, rowless{msg: m, since: first})
		}
	}
	if published < len(msgs) {
		r.Log.Debug("outbox: handed rows not published; left to the poll", "rows", len(msgs)-published, "stopped", stopped)
	}
}

// tryAgain publishes the messages with no row that the broker did not take
// before, and gives up on those handed over more than NoRowFor ago, or on
// all of them when the relay stops: the sweeper and the reapers find what
// they announce from its state.
func (r *Relay) tryAgain(ctx context.Context, final bool) {
	if len(r.again) == 0 {
		return
	}
	waited := cmp.Or(r.NoRowFor, 30*time.Second)
	var msgs []store.OutboxMsg
	var since []time.Time
	gaveUp := 0
	for _, a := range r.again {
		if time.Since(a.since) >= waited {
			r.countUnsent(ctx, a.msg.Stream)
			gaveUp++
			continue
		}
		msgs, since = append(msgs, a.msg), append(since, a.since)
	}
	r.again = nil
	if len(msgs) > 0 {
		r.sendSince(ctx, msgs, since)
	}
	if final {
		for _, a := range r.again {
			r.countUnsent(ctx, a.msg.Stream)
		}
		gaveUp += len(r.again)
		r.again = nil
	}
	if gaveUp > 0 {
		r.Log.Warn("outbox: messages with no row not published in time; the sweeper and the reapers find what they announce from its state",
			"messages", gaveUp, "tried_for", waited, "stopping", final)
	}
}

func (r *Relay) countUnsent(ctx context.Context, stream string) {
	if r.unsent != nil {
		r.unsent.Add(ctx, 1, r.labels(stream))
	}
}

// mark marks the handed rows sent since the last mark, in one statement.
func (r *Relay) mark(ctx context.Context) {
	if len(r.sent) == 0 {
		return
	}
	if _, err := r.Store.MarkPublished(ctx, r.sent); err != nil {
		r.Log.Warn("outbox: handed rows published but not marked; the poll publishes them again, and the broker keeps one copy",
			"rows", len(r.sent), "err", err)
	}
	r.sent = r.sent[:0]
}

func (r *Relay) init() (err error) {
	r.once.Do(func() {
		if r.Log == nil {
			r.Log = slog.Default()
		}
		if r.Meter != nil {
			r.setAside, err = r.Meter.Int64Counter("assay_outbox_set_aside",
				metric.WithDescription("outbox rows set aside after they could not be published"))
			// Each stream's series exists from the start, at zero, so a
			// rate over it is 0 and not absent until the first row.
			if err == nil {
				r.unsent, err = r.Meter.Int64Counter("assay_outbox_unsent",
					metric.WithDescription("messages with no outbox row the broker did not take in time, left to the state they announce"))
			}
			for _, st := range r.Streams {
				if err == nil {
					r.setAside.Add(context.Background(), 0, r.labels(st))
					r.unsent.Add(context.Background(), 0, r.labels(st))
				}
			}
		}
	})
	return err
}

func (r *Relay) labels(stream string) metric.MeasurementOption {
	if r.Region == "" {
		return metric.WithAttributes(attribute.String("stream", stream))
	}
	return metric.WithAttributes(attribute.String("stream", stream), attribute.String("region", r.Region))
}

// Kick asks for a drain now, e.g. right after a commit that wrote rows.
func (r *Relay) Kick() {
	r.mu.Lock()
	r.kicked = true
	r.mu.Unlock()
	r.ticker.Kick()
}

// Stop ends the relay after one last drain, of every waiting row, and
// waits for it. Idempotent.
func (r *Relay) Stop(ctx context.Context) {
	r.final.Store(true)
	r.ticker.Stop(ctx)
}

func (r *Relay) batch() int {
	if r.Batch <= 0 {
		return 100
	}
	return r.Batch
}

// errTooLarge marks a row larger than the broker takes.
var errTooLarge = errors.New("larger than the broker's max payload")

// Drain publishes one batch and returns how many rows it handled
// (published, failed or set aside). It stops early, without counting a
// try, when the broker is unreachable.
func (r *Relay) Drain(ctx context.Context) (int, error) { return r.drain(ctx, 0) }

func (r *Relay) drain(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := r.init(); err != nil {
		return 0, err
	}
	var stopped error
	d, err := r.Store.DrainOutbox(ctx, r.batch(), r.Streams, olderThan, r.SetAside, func(msgs []store.OutboxMsg) []store.Sent {
		sent, why := r.publishAll(ctx, msgs)
		stopped = why
		return sent
	})
	if err != nil {
		return 0, err
	}
	for _, f := range d.SetAside {
		if r.setAside != nil {
			r.setAside.Add(ctx, 1, r.labels(f.Stream))
		}
		telemetry.Decision(ctx, r.Log, f.MsgID, "set_aside",
			fmt.Sprintf("outbox row %d could not be published after %d tries: %s; list with assay outbox list, retry with assay outbox retry %d",
				f.ID, f.Tries, f.Err, f.ID),
			slog.String("stream", f.Stream), slog.String("subject", f.Subject), slog.Int("bytes", len(f.Payload)))
	}
	for _, f := range d.Failed {
		r.Log.Warn("outbox row not published; will try again", "key", f.MsgID, "outbox_id", f.ID, "tries", f.Tries, "err", f.Err)
	}
	if stopped != nil {
		return d.Published, fmt.Errorf("outbox: broker unreachable: %w", stopped)
	}
	return d.Published + len(d.Failed) + len(d.SetAside), nil
}

// publishAll publishes a drained batch with every message in flight at
// once, then reads the acks in order. It answers for a prefix of msgs: it
// stops at a broker that is unreachable (stopped says why; that row counts
// no try) and after the first row that had no ack in time (a broker that
// refuses without a word looks so; the rest wait for the next pass). A row
// the broker did take but whose ack was not read is published again then,
// and the stream's Nats-Msg-Id window drops the copy.
func (r *Relay) publishAll(ctx context.Context, msgs []store.OutboxMsg) (sent []store.Sent, stopped error) {
	timeout := r.PublishTimeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	type flight struct {
		f    jetstream.PubAckFuture
		done *store.Sent // answered without a publish
	}
	flights := make([]flight, 0, len(msgs))
	for _, m := range msgs {
		nm, tooLarge := r.message(m)
		if tooLarge != nil {
			flights = append(flights, flight{done: tooLarge})
			continue
		}
		f, err := r.JS.PublishMsgAsync(nm, jetstream.WithMsgID(m.MsgID))
		if err != nil {
			flights = append(flights, flight{done: &store.Sent{Err: err}})
			break
		}
		flights = append(flights, flight{f: f})
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	ensured := map[string]bool{}
	for i, fl := range flights {
		s := store.Sent{}
		switch {
		case fl.done != nil:
			s = *fl.done
		default:
			select {
			case <-fl.f.Ok():
			case err := <-fl.f.Err():
				s.Err = err
			case <-timer.C:
				s.Err = context.DeadlineExceeded
			case <-ctx.Done():
				s.Err = ctx.Err()
			}
		}
		if errors.Is(s.Err, jetstream.ErrNoStreamResponse) || errors.Is(s.Err, nats.ErrNoResponders) {
			// No stream takes the subject: this row, and the rest one at
			// a time, after the stream is made again.
			s = r.publish(ctx, msgs[i], ensured)
		} else if errors.Is(s.Err, nats.ErrMaxPayload) {
			s.Permanent = true
		}
		if s.Err != nil && (ctx.Err() != nil || unreachable(s.Err)) {
			return sent, s.Err
		}
		sent = append(sent, s)
		if errors.Is(s.Err, context.DeadlineExceeded) {
			return sent, nil
		}
	}
	return sent, nil
}

// message is the NATS message of a row, or the refusal of a row larger
// than the broker takes.
func (r *Relay) message(m store.OutboxMsg) (*nats.Msg, *store.Sent) {
	nm := &nats.Msg{Subject: m.Subject, Data: m.Payload, Header: nats.Header{}}
	for k, v := range m.Headers {
		nm.Header.Set(k, v)
	}
	if r.MaxPayload > 0 && int64(len(m.Payload)+headerBytes(nm.Header)+len(m.Subject)) > r.MaxPayload {
		return nil, &store.Sent{Err: fmt.Errorf("%d bytes: %w of %d", len(m.Payload), errTooLarge, r.MaxPayload), Permanent: true}
	}
	return nm, nil
}

// publish sends one row, creating its stream again once when the broker
// says none takes its subject.
func (r *Relay) publish(ctx context.Context, m store.OutboxMsg, ensured map[string]bool) store.Sent {
	nm, tooLarge := r.message(m)
	if tooLarge != nil {
		return *tooLarge
	}
	err := r.send(ctx, nm, m.MsgID)
	if errors.Is(err, jetstream.ErrNoStreamResponse) && r.Ensure != nil && !ensured[m.Stream] {
		ensured[m.Stream] = true
		if eerr := r.Ensure(ctx, m.Stream); eerr != nil {
			return store.Sent{Err: fmt.Errorf("no stream takes %s, and creating %s failed: %w", m.Subject, m.Stream, eerr)}
		}
		r.Log.Warn("outbox: stream was missing and is created again", "stream", m.Stream)
		err = r.send(ctx, nm, m.MsgID)
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return store.Sent{Err: err, Permanent: true}
	}
	return store.Sent{Err: err}
}

// send publishes one message and waits for its ack up to PublishTimeout.
func (r *Relay) send(ctx context.Context, nm *nats.Msg, msgID string) error {
	d := r.PublishTimeout
	if d <= 0 {
		d = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := r.JS.PublishMsg(ctx, nm, jetstream.WithMsgID(msgID))
	return err
}

// unreachable says the broker, not the row, is at fault: stop the drain and
// count no try.
func unreachable(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrConnectionDraining) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrInvalidConnection)
}

func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n + len(jetstream.MsgIDHeader) + 64
}
