package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var names = event.Names{Cell: "us"}

var streams = []string{event.KindWork}

type bundle struct {
	ctx    context.Context
	store  *store.Store
	db     *pgxpool.Pool // writes outbox rows as a service's transaction would
	js     jetstream.JetStream
	stream jetstream.Stream
}

// migrated is a store on a fresh, migrated database of the test's own,
// and that database's URL. (The dev kit's storetest does the same for
// other modules; a test of assay.dev/pkg does not import the dev kit
// beyond testenv.)
func migrated(t *testing.T) (*store.Store, string) {
	t.Helper()
	url := testenv.Database(t)
	s, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s, url
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx := t.Context()
	s, url := migrated(t)
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	st, err := event.EnsureStream(ctx, js, nil, names, event.KindWork, event.StreamSettings{})
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(db.Close)
	return bundle{ctx: ctx, store: s, db: db, js: js, stream: st}
}

func (b bundle) write(t *testing.T, msgs ...store.OutboxMsg) {
	t.Helper()
	if err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error { return insertRows(b.ctx, tx, msgs) }); err != nil {
		t.Fatalf("insert outbox: %v", err)
	}
}

func insertRows(ctx context.Context, tx pgx.Tx, msgs []store.OutboxMsg) error {
	for _, m := range msgs {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (stream, subject, msg_id, payload, headers) VALUES ($1, $2, $3, $4, $5)`,
			m.Stream, m.Subject, m.MsgID, m.Payload, m.Headers); err != nil {
			return err
		}
	}
	return nil
}

func (b bundle) pending(t *testing.T) int {
	t.Helper()
	n, err := b.store.PendingOutbox(b.ctx)
	if err != nil {
		t.Fatalf("pending: %v", err)
	}
	return n
}

func (b bundle) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	info, err := b.stream.Info(b.ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

func workMsg(t *testing.T, ctx context.Context, workID string, dispatch int) store.OutboxMsg {
	t.Helper()
	ev := event.Work{WorkID: workID, TenantID: "acme", Region: "us", Lane: event.Batch, Dispatch: dispatch}
	m, err := outbox.Msg(ctx, event.KindWork, names.Work(event.Batch, "acme"), event.WorkMsgID(workID, dispatch), ev)
	if err != nil {
		t.Fatalf("outbox msg: %v", err)
	}
	return m
}

func TestMsgCarriesTraceContext(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("outbox-test").Start(t.Context(), "submit")
	defer span.End()

	m := workMsg(t, ctx, "w_1", 1)
	tp0 := m.Headers["traceparent"]
	want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
	if tp0 != want {
		t.Fatalf("traceparent header = %q (headers %v), want %q", tp0, m.Headers, want)
	}
	if m.MsgID != "w_1.1" || m.Subject != "assay.us.work.batch.acme" {
		t.Fatalf("msg = %+v", m)
	}
	var ev event.Work
	if err := event.Decode(m.Payload, &ev); err != nil || ev.WorkID != "w_1" || ev.Dispatch != 1 {
		t.Fatalf("payload %s decodes to %+v, %v", m.Payload, ev, err)
	}

	plain := workMsg(t, context.Background(), "w_2", 1)
	if len(plain.Headers) != 0 {
		t.Fatalf("headers without a span = %v, want none", plain.Headers)
	}
	if _, err := outbox.Msg(ctx, event.KindWork, "s", "id", func() {}); err == nil {
		t.Fatal("Msg accepted a value JSON cannot encode")
	}
}

func TestDrainPublishesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("outbox-test").Start(b.ctx, "submit")
	defer span.End()

	first, second := workMsg(t, ctx, "w_1", 1), workMsg(t, ctx, "w_2", 1)
	b.write(t, first, second)
	rolledBack := workMsg(t, ctx, "w_3", 1)
	err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		if err := insertRows(b.ctx, tx, []store.OutboxMsg{rolledBack}); err != nil {
			return err
		}
		return fmt.Errorf("abort")
	})
	if err == nil {
		t.Fatal("aborted transaction committed")
	}

	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Batch: 10}
	n, err := relay.Drain(b.ctx)
	if err != nil || n != 2 {
		t.Fatalf("drain: n=%d err=%v, want 2", n, err)
	}
	if n, err := relay.Drain(b.ctx); err != nil || n != 0 {
		t.Fatalf("second drain: n=%d err=%v, want 0", n, err)
	}
	if p := b.pending(t); p != 0 {
		t.Fatalf("pending = %d, want 0", p)
	}
	if got := b.streamMsgs(t); got != 2 {
		t.Fatalf("stream holds %d messages, want 2", got)
	}

	for seq, want := range []store.OutboxMsg{first, second} {
		raw, err := b.stream.GetMsg(b.ctx, uint64(seq+1))
		if err != nil {
			t.Fatalf("get msg %d: %v", seq+1, err)
		}
		if raw.Subject != want.Subject || string(raw.Data) != string(want.Payload) {
			t.Fatalf("msg %d = %s %s, want %s %s", seq+1, raw.Subject, raw.Data, want.Subject, want.Payload)
		}
		if got := raw.Header.Get(jetstream.MsgIDHeader); got != want.MsgID {
			t.Fatalf("msg %d Nats-Msg-Id = %q, want %q", seq+1, got, want.MsgID)
		}
		if got := raw.Header.Get("traceparent"); got == "" || got != want.Headers["traceparent"] {
			t.Fatalf("msg %d traceparent = %q, want %q", seq+1, got, want.Headers["traceparent"])
		}
		remote := trace.SpanContextFromContext(telemetry.Extract(context.Background(), raw.Header))
		if remote.TraceID() != span.SpanContext().TraceID() || remote.SpanID() != span.SpanContext().SpanID() {
			t.Fatalf("msg %d carries trace %s/%s, want %s/%s", seq+1, remote.TraceID(), remote.SpanID(),
				span.SpanContext().TraceID(), span.SpanContext().SpanID())
		}
	}

	// A row re-announcing the same dispatch is published but stored once.
	b.write(t, workMsg(t, ctx, "w_1", 1))
	if n, err := relay.Drain(b.ctx); err != nil || n != 1 {
		t.Fatalf("drain duplicate: n=%d err=%v, want 1", n, err)
	}
	if got := b.streamMsgs(t); got != 2 {
		t.Fatalf("stream holds %d messages after a duplicate Nats-Msg-Id, want 2", got)
	}
}

// Poison rows never block: a row larger than the broker takes and a row
// whose subject no stream takes sit between good rows; the good ones go
// out in order, the oversize one is set aside at once, the other after its
// tries.
func TestPoisonRowsAreSetAside(t *testing.T) {
	t.Parallel()
	b := setup(t)
	huge := workMsg(t, b.ctx, "w_huge", 1)
	huge.Payload = []byte(`{"workId":"` + strings.Repeat("x", 2<<20) + `"}`)
	orphan := store.OutboxMsg{Stream: event.KindWork, Subject: "assay.us.nowhere.acme", MsgID: "x", Payload: []byte(`{}`), Headers: map[string]string{}}
	b.write(t, workMsg(t, b.ctx, "w_1", 1), huge, orphan, workMsg(t, b.ctx, "w_2", 1))

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Batch: 10,
		MaxPayload: b.js.Conn().MaxPayload(), SetAside: store.SetAsidePolicy{MaxTries: 2, Grace: -1},
		Ensure: func(ctx context.Context, kind string) error {
			_, err := event.EnsureStream(ctx, b.js, nil, names, kind, event.StreamSettings{})
			return err
		}}
	if n, err := relay.Drain(ctx); err != nil || n != 4 {
		t.Fatalf("first drain: n=%d err=%v, want 4 rows handled", n, err)
	}
	if got := b.streamMsgs(t); got != 2 {
		t.Fatalf("stream holds %d messages, want the 2 good ones", got)
	}
	if n, err := relay.Drain(ctx); err != nil || n != 1 {
		t.Fatalf("second drain: n=%d err=%v, want the orphan tried again", n, err)
	}
	if p := b.pending(t); p != 0 {
		t.Fatalf("pending = %d, want 0: both poison rows set aside", p)
	}
	aside, err := b.store.SetAsideRows(b.ctx, 10)
	if err != nil || len(aside) != 2 || aside[0].MsgID != huge.MsgID || !strings.Contains(aside[0].LastError, "max payload") ||
		aside[1].MsgID != "x" || aside[1].Tries != 2 {
		t.Fatalf("set-aside rows %+v, %v", aside, err)
	}
	// Later rows are not held up.
	b.write(t, workMsg(t, b.ctx, "w_3", 1))
	if n, err := relay.Drain(ctx); err != nil || n != 1 || b.streamMsgs(t) != 3 {
		t.Fatalf("drain after the poison: n=%d err=%v, stream %d", n, err, b.streamMsgs(t))
	}
}

// A relay whose stream the broker lost creates it again and publishes.
func TestRelayCreatesALostStreamAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.js.DeleteStream(b.ctx, names.Stream(event.KindWork)); err != nil {
		t.Fatal(err)
	}
	b.write(t, workMsg(t, b.ctx, "w_1", 1))
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams,
		Ensure: func(ctx context.Context, kind string) error {
			_, err := event.EnsureStream(ctx, b.js, nil, names, kind, event.StreamSettings{})
			return err
		}}
	if n, err := relay.Drain(b.ctx); err != nil || n != 1 {
		t.Fatalf("drain: n=%d err=%v", n, err)
	}
	if p := b.pending(t); p != 0 {
		t.Fatalf("pending = %d, want 0", p)
	}
	st, err := b.js.Stream(b.ctx, names.Stream(event.KindWork))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(b.ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream created again holds %v messages (%v), want 1", info.State.Msgs, err)
	}
}

func TestRelayStartKickStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Every: time.Hour, Batch: 20}
	if err := relay.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Stop(context.Background()) })

	var msgs []store.OutboxMsg
	for i := range 45 {
		msgs = append(msgs, workMsg(t, b.ctx, fmt.Sprintf("w_%d", i), 1))
	}
	b.write(t, msgs...)
	relay.Kick()
	relay.Kick()
	deadline := time.Now().Add(30 * time.Second)
	for b.pending(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("kicked relay left %d pending after 30s", b.pending(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := b.streamMsgs(t); got != 45 {
		t.Fatalf("stream holds %d messages, want 45", got)
	}

	b.write(t, workMsg(t, b.ctx, "w_last", 1), workMsg(t, b.ctx, "w_last", 2))
	relay.Stop(b.ctx)
	relay.Stop(b.ctx)
	if p := b.pending(t); p != 0 {
		t.Fatalf("pending after Stop = %d, want 0", p)
	}
	if got := b.streamMsgs(t); got != 47 {
		t.Fatalf("stream holds %d messages after Stop, want 47", got)
	}
}

// A relay runs until it is stopped, not until its start context ends: a
// process stops its parts in order after its signal, and the relay's final
// drain comes after the rows the others wrote while stopping.
func TestRelayOutlivesItsStartContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Every: 10 * time.Millisecond}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	b.write(t, workMsg(t, b.ctx, "w_1", 1))
	deadline := time.Now().Add(30 * time.Second)
	for b.pending(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay stopped publishing when its start context ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	relay.Stop(b.ctx)
}

// Rows handed over are published without a poll: the relay polls once an
// hour here, and a row written but not handed stays where it is. They are
// marked, dated when the broker took them, before the next poll, which
// then sends only what the hand-off did not: the row not handed over, and
// one larger than the broker takes, which it tries and sets aside.
func TestSendPublishesHandedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Every: time.Hour,
		MaxPayload: b.js.Conn().MaxPayload()}
	if err := relay.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Stop(context.Background()) })
	// Every message sent to the subject, copies the stream drops included.
	copies, err := b.js.Conn().SubscribeSync(names.Work(event.Batch, "acme"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = copies.Unsubscribe() })

	var handed []store.OutboxMsg
	for i := range 30 {
		handed = append(handed, workMsg(t, b.ctx, fmt.Sprintf("w_%d", i), 1))
	}
	huge := workMsg(t, b.ctx, "w_huge", 1)
	huge.Payload = []byte(`{"workId":"` + strings.Repeat("x", 2<<20) + `"}`)
	unhanded := workMsg(t, b.ctx, "w_unhanded", 1)
	b.write(t, append(handed, huge, unhanded)...)
	relay.Send(handed[:10]...)
	relay.Send(append(handed[10:], huge)...)
	relay.Send(handed[0]) // handed twice: stored once
	deadline := time.Now().Add(30 * time.Second)
	for b.streamMsgs(t) != 30 {
		if time.Now().After(deadline) {
			t.Fatalf("stream holds %d messages 30s after 30 were handed over", b.streamMsgs(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	relay.Kick()
	for b.pending(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows pending after a kick, want 0", b.pending(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := b.streamMsgs(t); got != 31 {
		t.Fatalf("stream holds %d messages after the poll, want 31", got)
	}
	// The copies are on their way to the subscription: the 32 sent (the
	// first handed row twice) are waited for, then any more for half a
	// second, which would be too many.
	sent := map[string]int{}
	for n := 0; ; n++ {
		wait := 30 * time.Second
		if n >= 32 {
			wait = 500 * time.Millisecond
		}
		m, err := copies.NextMsg(wait)
		if err != nil {
			break
		}
		sent[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	for i, m := range append(handed, unhanded) {
		if want := map[bool]int{true: 2, false: 1}[i == 0]; sent[m.MsgID] != want {
			t.Fatalf("%s was sent %d times, want %d: the poll sends only what no hand-off did (%v)", m.MsgID, sent[m.MsgID], want, sent)
		}
	}
	if len(sent) != 31 {
		t.Fatalf("%d distinct messages sent, want 31", len(sent))
	}
	var early int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE published_at < created_at`).Scan(&early); err != nil || early != 0 {
		t.Fatalf("%d rows dated published before they were written (%v)", early, err)
	}
	aside, err := b.store.SetAsideRows(b.ctx, 10)
	if err != nil || len(aside) != 1 || aside[0].MsgID != huge.MsgID || aside[0].Tries != 1 {
		t.Fatalf("set-aside rows %+v, %v: want the oversize row, tried once by the poll", aside, err)
	}
}

// A relay that is handed rows leaves rows younger than a second to the
// hand-offs in its timed polls, and takes them after that: a process that
// wrote a row and stopped before handing it over loses nothing.
func TestPollTakesRowsNobodyHandedOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams, Every: 20 * time.Millisecond}
	if err := relay.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Stop(context.Background()) })
	first := workMsg(t, b.ctx, "w_first", 1)
	b.write(t, first)
	relay.Send(first)
	deadline := time.Now().Add(30 * time.Second)
	for b.pending(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the handed row was not published")
		}
		time.Sleep(10 * time.Millisecond)
	}

	var written time.Time
	orphan := workMsg(t, b.ctx, "w_orphan", 1)
	if err := pgx.BeginFunc(b.ctx, b.db, func(tx pgx.Tx) error {
		if err := insertRows(b.ctx, tx, []store.OutboxMsg{orphan}); err != nil {
			return err
		}
		return tx.QueryRow(b.ctx, `SELECT now()`).Scan(&written)
	}); err != nil {
		t.Fatal(err)
	}
	var publishedAt time.Time
	for {
		err := b.db.QueryRow(b.ctx, `SELECT published_at FROM outbox WHERE msg_id = $1 AND published_at IS NOT NULL`,
			orphan.MsgID).Scan(&publishedAt)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a row nobody handed over is still pending after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if age := publishedAt.Sub(written); age < time.Second {
		t.Fatalf("the timed poll took a row %s old, want it left to the hand-off for a second", age)
	}
	if got := b.streamMsgs(t); got != 2 {
		t.Fatalf("stream holds %d messages, want 2", got)
	}
}

// A message with no row is published once and never dated; one the broker
// does not take is tried again at the poll's pace, and past NoRowFor it is
// counted and left to the state it announces.
func TestMessagesWithNoRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// start starts a relay with a meter of its own; stop stops it once.
	var relay *outbox.Relay
	var reader *sdkmetric.ManualReader
	var stop func()
	start := func() {
		reader = sdkmetric.NewManualReader()
		meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
		r := &outbox.Relay{Store: b.store, JS: b.js, Log: slog.New(slog.DiscardHandler), Streams: streams,
			Every: 20 * time.Millisecond, NoRowFor: 5 * time.Second, PublishTimeout: 200 * time.Millisecond, Meter: meter}
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		stopped := false
		relay, stop = r, func() {
			if !stopped {
				stopped = true
				r.Stop(context.Background())
			}
		}
		t.Cleanup(stop)
	}
	start()
	noRow := func(id string) store.OutboxMsg {
		m := workMsg(t, b.ctx, id, 1)
		m.NoRow = true
		return m
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 30s: %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	unsent := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(b.ctx, &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "assay_outbox_unsent" {
					for _, dp := range sum.DataPoints {
						n += dp.Value
					}
				}
			}
		}
		return n
	}
	ensure := func() {
		st, err := event.EnsureStream(b.ctx, b.js, nil, names, event.KindWork, event.StreamSettings{})
		if err != nil {
			t.Fatal(err)
		}
		b.stream = st
	}

	relay.Send(noRow("w_1"))
	waitFor("the message with no row in the stream", func() bool { return b.streamMsgs(t) == 1 })
	var rows int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows (%v), want none", rows, err)
	}

	// The broker has no stream for a while, shorter than NoRowFor: the
	// message is tried again and arrives.
	if err := b.js.DeleteStream(b.ctx, names.Stream(event.KindWork)); err != nil {
		t.Fatal(err)
	}
	tries, err := b.js.Conn().SubscribeSync(names.Work(event.Batch, "acme"))
	if err != nil {
		t.Fatal(err)
	}
	relay.Send(noRow("w_2"))
	if _, err := tries.NextMsg(30 * time.Second); err != nil { // a try no stream took
		t.Fatalf("no try of the message: %v", err)
	}
	_ = tries.Unsubscribe()
	ensure()
	waitFor("the message tried again in the stream", func() bool { return b.streamMsgs(t) == 1 })
	if n := unsent(); n != 0 {
		t.Fatalf("assay_outbox_unsent = %d after a message that arrived, want 0", n)
	}

	// Longer than NoRowFor: counted and left; the last pass, with the
	// stream back, does not send it. A relay of its own, so that nothing
	// the first one still tries again (a try the broker stored after its
	// publish timed out, on a loaded machine) is counted for this message.
	stop()
	start()
	if err := b.js.DeleteStream(b.ctx, names.Stream(event.KindWork)); err != nil {
		t.Fatal(err)
	}
	relay.Send(noRow("w_3"))
	waitFor("assay_outbox_unsent to count the message", func() bool { return unsent() == 1 })
	ensure()
	stop()
	if n := b.streamMsgs(t); n != 0 {
		t.Fatalf("the stream holds %d messages after a given-up message, want 0", n)
	}
}
