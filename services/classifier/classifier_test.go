package classifier_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/classifier"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var names = event.Names{Cell: "us"}

// bundle is the classifier alone, started on real Postgres and JetStream
// with the simulated provider: what ingress would do (the work row, the
// WORK stream, the announcement) the test does itself.
type bundle struct {
	svc *classifier.Service
	st  *store.Store
	db  *pgxpool.Pool
	js  jetstream.JetStream
	sim *sim.Server
	log *logBuffer
	// streams are the settings of the streams the test makes.
	streams event.StreamSettings
}

// logBuffer holds what the classifier logged.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := newBundle(t, testenv.NATS(t), event.StreamSettings{})
	if err := b.svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return b
}

// newBundle builds the classifier on the NATS at natsURL with its streams
// and buckets made with streams, and its settings as edit leaves them,
// without starting it; it is stopped when the test ends.
func newBundle(t *testing.T, natsURL string, streams event.StreamSettings, edit ...func(*classifier.Config)) *bundle {
	t.Helper()
	st, url := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := sim.New(sim.Options{})
	simURL, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetrytest.Provider(t, "classifier", "us")
	logs := &logBuffer{}
	cfg := classifier.Config{Region: "us", Model: "assay-sim-1", BackoffBase: 10 * time.Millisecond, Streams: streams}
	for _, e := range edit {
		e(&cfg)
	}
	svc, err := classifier.New(cfg,
		classifier.Deps{Store: st, JS: js, Model: &model.Client{BaseURL: sim.APIBase(simURL), Model: "assay-sim-1"}, Contracts: reg,
			Log: slog.New(slog.NewJSONHandler(logs, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })
	return &bundle{svc: svc, st: st, db: testenv.Pool(t, url), js: js, sim: s, log: logs, streams: streams}
}

// enqueue stores moderation work and announces it, as ingress would.
func (b *bundle) enqueue(t *testing.T, source, text string) string {
	t.Helper()
	ctx := t.Context()
	in, _ := json.Marshal(map[string]string{"text": text})
	w, _, err := b.st.InsertWork(ctx, &store.Work{ID: "w_" + source, TenantID: "acme", Region: "us", Contract: "moderation",
		SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: source, Revision: "r1", Lane: event.Interactive,
		Input: string(in), Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Minute)},
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.EnsureStream(ctx, b.js, nil, names, event.KindWork, b.streams); err != nil {
		t.Fatal(err)
	}
	ev, _ := json.Marshal(event.Work{WorkID: w.ID, TenantID: "acme", Region: "us", Lane: event.Interactive, Dispatch: 1,
		DeadlineAt: w.DeadlineAt})
	if _, err := b.js.Publish(ctx, names.Work(event.Interactive, "acme"), ev); err != nil {
		t.Fatal(err)
	}
	return w.ID
}

// events waits for n messages on the cell's stream of kind.
func (b *bundle) events(t *testing.T, kind string, n int) []jetstream.RawStreamMsg {
	t.Helper()
	ctx := t.Context()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := b.js.Stream(ctx, names.Stream(kind))
		if err == nil {
			info, err := st.Info(ctx)
			if err == nil && info.State.Msgs >= uint64(n) {
				var out []jetstream.RawStreamMsg
				for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, *m)
				}
				return out
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s events not published within 15s", n, kind)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The classifier on its own: it creates the streams it owns, consumes the
// announcement, claims, calls the model once, and hands the answer over as
// one ATTEMPT event, the call's usage with its result, keeping the lease
// for the committer. Nothing goes to RESULT, which holds what earlier
// releases published.
func TestClassifierAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, "post-1", "buy now, free money")
	attempts := b.events(t, event.KindAttempt, 1)
	var att event.Attempt
	if err := event.Decode(attempts[0].Data, &att); err != nil {
		t.Fatal(err)
	}
	if att.Result == nil || att.NoCall {
		t.Fatalf("attempt %+v; want a call with its result", att)
	}
	res := *att.Result
	if res.WorkID != id || res.Outcome != outcome.AttemptOK || !res.Final {
		t.Fatalf("result %+v", res)
	}
	if att.AttemptID != res.AttemptID || att.Outcome != outcome.AttemptOK || att.InputUnits <= 0 {
		t.Fatalf("attempt %+v", att)
	}
	// The answer stays in the cell with its attempt; the event names it.
	var raw []byte
	if err := b.db.QueryRow(t.Context(), `SELECT raw_response FROM attempts WHERE id = $1`, res.AttemptID).Scan(&raw); err != nil ||
		!json.Valid(raw) {
		t.Fatalf("raw answer %q, %v", raw, err)
	}
	if len(attempts[0].Data) > 2048 {
		t.Fatalf("the ATTEMPT event is %d bytes; it should carry no answer", len(attempts[0].Data))
	}
	st, err := b.js.Stream(t.Context(), names.Stream(event.KindResult))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(t.Context()); err != nil {
		t.Fatal(err)
	} else if info.State.Msgs != 0 {
		t.Fatalf("RESULT holds %d messages; want none", info.State.Msgs)
	}
	w, err := b.st.GetWork(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if w.State != outcome.Running || w.LeaseToken != res.LeaseToken || time.Until(w.LeaseExpiresAt) < 4*time.Minute {
		t.Fatalf("work %s lease %s until %s; want it held for the committer", w.State, w.LeaseToken, w.LeaseExpiresAt)
	}
	if n := b.sim.Stats().Tenants["acme"].Calls; n != 1 {
		t.Fatalf("provider calls = %d, want 1", n)
	}
	if err := b.svc.Ready(t.Context()); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

// Split (ASSAY_ATTEMPT_EVENTS=split), an attempt is a RESULT event and the
// call's ATTEMPT event without the result, as committers and ledgers of
// releases before one event per attempt read.
func TestSplitEventsForEarlierReleases(t *testing.T) {
	t.Parallel()
	b := newBundle(t, testenv.NATS(t), event.StreamSettings{}, func(c *classifier.Config) { c.SplitEvents = true })
	if err := b.svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, "post-1", "buy now, free money")
	var res event.Result
	if err := event.Decode(b.events(t, event.KindResult, 1)[0].Data, &res); err != nil {
		t.Fatal(err)
	}
	var att event.Attempt
	if err := event.Decode(b.events(t, event.KindAttempt, 1)[0].Data, &att); err != nil {
		t.Fatal(err)
	}
	if res.WorkID != id || res.Outcome != outcome.AttemptOK || att.AttemptID != res.AttemptID || att.Result != nil || att.NoCall {
		t.Fatalf("result %+v, attempt %+v; want the result on RESULT and the call alone on ATTEMPT", res, att)
	}
}

// A refusal ends the work transport_rejected in the classifier itself; a
// 429 is retried after its Retry-After; both are recorded attempts.
func TestClassifierEndsAndRetriesOnItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.sim.AddFault(sim.Fault{Kind: sim.FaultReject, Tenant: "acme", Match: "refuse me", Times: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.sim.AddFault(sim.Fault{Kind: sim.FaultRateLimit, Tenant: "acme", Match: "slow down", Times: 1}); err != nil {
		t.Fatal(err)
	}
	refused := b.enqueue(t, "post-refused", "refuse me")
	limited := b.enqueue(t, "post-limited", "slow down")
	b.events(t, event.KindAttempt, 3) // the refusal, the 429 and its retry
	deadline := time.Now().Add(15 * time.Second)
	for {
		var state string
		if err := b.db.QueryRow(t.Context(), `SELECT state FROM work WHERE id = $1`, refused).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state == outcome.TransportRejected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused work is %s, want transport_rejected", state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What the provider said of the refusal is the operator's: in the
	// decision log, never in the reasons the tenant's API shows.
	const said = "rejected as a result of our safety system"
	var workReason, attemptReason string
	if err := b.db.QueryRow(t.Context(), `SELECT w.reason, a.reason FROM work w JOIN attempts a ON a.work_id = w.id
		WHERE w.id = $1`, refused).Scan(&workReason, &attemptReason); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{workReason, attemptReason} {
		if strings.Contains(r, said) || strings.Contains(r, "127.0.0.1") || !strings.Contains(r, "transport_rejected (HTTP 400)") {
			t.Errorf("reason %q: want the kind and status without the provider's words or address", r)
		}
	}
	if log := b.log.String(); !strings.Contains(log, `"provider_message":"Your request was `+said) || !strings.Contains(log, `"asked":"POST http://`) {
		t.Errorf("the decision log lacks the provider's message or the URL asked:\n%s", log)
	}
	var outcomes []string
	rows, err := b.db.Query(t.Context(), `SELECT outcome FROM attempts WHERE work_id = $1 ORDER BY number`, limited)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, o)
	}
	if len(outcomes) != 2 || outcomes[0] != outcome.AttemptRateLimited || outcomes[1] != outcome.AttemptOK {
		t.Fatalf("attempts of the rate-limited work: %v, want rate_limited then ok", outcomes)
	}
}
