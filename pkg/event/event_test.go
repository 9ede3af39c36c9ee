package event_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestSubjectsAndStreams(t *testing.T) {
	t.Parallel()
	us, eu := event.Names{Cell: "us"}, event.Names{Installation: "assay", Cell: "eu"}
	staging := event.Names{Installation: "staging-2", Cell: "us-1"}
	cases := []struct{ got, want string }{
		{us.Work(event.Interactive, "acme"), "assay.us.work.interactive.acme"},
		{eu.Work(event.Batch, "acme-2"), "assay.eu.work.batch.acme-2"},
		{us.Lane(event.Batch), "assay.us.work.batch.>"},
		{us.Cancel("acme"), "assay.us.work.cancel.acme"},
		{us.Cancels(), "assay.us.work.cancel.>"},
		{us.Result("acme"), "assay.us.result.acme"},
		{eu.Attempt("acme"), "assay.eu.attempt.acme"},
		{us.Stream(event.KindWork), "ASSAY_WORK_US"},
		{eu.Stream(event.KindResult), "ASSAY_RESULT_EU"},
		{us.Stream(event.KindAttempt), "ASSAY_ATTEMPT_US"},
		{us.Subjects(event.KindWork), "assay.us.work.>"},
		{eu.Subjects(event.KindResult), "assay.eu.result.>"},
		{us.Subjects(event.KindAttempt), "assay.us.attempt.>"},
		{us.Durable("committer"), "assay-committer"},
		{staging.Work(event.Batch, "acme"), "staging-2.us-1.work.batch.acme"},
		{staging.Stream(event.KindWork), "STAGING_2_WORK_US_1"},
		{staging.Durable("ledger"), "staging-2-ledger"},
		{event.WorkMsgID("w_abc", 3), "w_abc.3"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestNamesCheck(t *testing.T) {
	t.Parallel()
	for _, n := range []event.Names{{Cell: "us"}, {Installation: "prod", Cell: "eu-2"}} {
		if err := n.Check(); err != nil {
			t.Errorf("%+v: %v", n, err)
		}
	}
	for _, n := range []event.Names{{}, {Cell: "US"}, {Cell: "us.east"}, {Installation: "a.b", Cell: "us"}, {Installation: "*", Cell: "us"}} {
		if err := n.Check(); err == nil {
			t.Errorf("%+v accepted", n)
		}
	}
}

func TestValidTokenAndLane(t *testing.T) {
	t.Parallel()
	good := []string{"acme", "a", "0", "acme-2", "a-", strings.Repeat("a", 63)}
	bad := []string{"", "-acme", "ac.me", "acme.", "*", ">", "ac*", "a>", "ac me", " acme", "acme\n", "Acme",
		"ACME", "ac_me", "acmé", strings.Repeat("a", 64), "ac\tme"}
	for _, s := range good {
		if !event.ValidToken(s) {
			t.Errorf("ValidToken(%q) = false, want true", s)
		}
	}
	for _, s := range bad {
		if event.ValidToken(s) {
			t.Errorf("ValidToken(%q) = true, want false", s)
		}
	}
	for _, l := range []string{event.Interactive, event.Batch} {
		if !event.ValidLane(l) {
			t.Errorf("ValidLane(%q) = false", l)
		}
	}
	for _, l := range []string{"", "Batch", "bulk", "batch ", "*"} {
		if event.ValidLane(l) {
			t.Errorf("ValidLane(%q) = true", l)
		}
	}
}

func TestForeignRegion(t *testing.T) {
	t.Parallel()
	if why, foreign := event.ForeignRegion("work", "us", "us"); foreign || why != "" {
		t.Errorf("the cell's own work: %q, %v; want no refusal", why, foreign)
	}
	why, foreign := event.ForeignRegion("attempt", "eu", "us")
	if want := "attempt of region eu reached the us cell"; !foreign || why != want {
		t.Errorf("another region's attempt: %q, %v; want %q, true", why, foreign, want)
	}
}

const (
	goodWork    = `{"workId":"w_1","tenantId":"acme","region":"us","lane":"batch","dispatch":1}`
	a1          = "00000000-0000-4000-8000-0000000000a1"
	t1          = "00000000-0000-4000-8000-0000000000b1"
	goodResult  = `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","region":"us","number":1,"leaseToken":"` + t1 + `","outcome":"ok","final":true}`
	goodAttempt = `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","region":"us","number":1,"model":"m","outcome":"ok","inputUnits":10,"outputUnits":5,"at":"2026-03-01T00:00:00Z"}`
)

func TestDecodeAccepts(t *testing.T) {
	t.Parallel()
	var w event.Work
	if err := event.Decode([]byte(goodWork), &w); err != nil {
		t.Fatalf("work: %v", err)
	}
	if w != (event.Work{WorkID: "w_1", TenantID: "acme", Region: "us", Lane: "batch", Dispatch: 1}) {
		t.Fatalf("work = %+v", w)
	}
	var r event.Result
	if err := event.Decode([]byte(goodResult), &r); err != nil {
		t.Fatalf("result: %v", err)
	}
	if r.AttemptID != a1 || r.LeaseToken != t1 || !r.Final {
		t.Fatalf("result = %+v", r)
	}
	var a event.Attempt
	if err := event.Decode([]byte(goodAttempt+"\n"), &a); err != nil {
		t.Fatalf("attempt with a trailing newline: %v", err)
	}
	if a.InputUnits != 10 || !a.At.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("attempt = %+v", a)
	}
	var carried event.Attempt
	with := `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","noCall":true,"result":` + goodResult + `}`
	if err := event.Decode([]byte(with), &carried); err != nil {
		t.Fatalf("attempt carrying its result: %v", err)
	}
	if carried.Result == nil || *carried.Result != r || !carried.NoCall {
		t.Fatalf("attempt carrying its result = %+v", carried)
	}
	if res, err := event.AttemptResult([]byte(with)); err != nil || res == nil || *res != r {
		t.Fatalf("the committer's result of an attempt carrying one: %+v, %v", res, err)
	}
	if res, err := event.AttemptResult([]byte(goodAttempt)); err != nil || res != nil {
		t.Fatalf("the committer's result of a call carrying none: %+v, %v; want none", res, err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	workWith := func(tenant, lane string) string {
		return `{"workId":"w_1","tenantId":"` + tenant + `","region":"us","lane":"` + lane + `","dispatch":1}`
	}
	work := map[string]string{
		"unknown field":     `{"workId":"w_1","tenantId":"acme","region":"us","lane":"batch","extra":1}`,
		"trailing object":   goodWork + `{}`,
		"trailing garbage":  goodWork + ` x`,
		"trailing array":    goodWork + `[]`,
		"not an object":     `[1]`,
		"empty":             ``,
		"null":              `null`,
		"wrong type":        `{"workId":1,"tenantId":"acme","region":"us","lane":"batch"}`,
		"truncated":         goodWork[:len(goodWork)-1],
		"tenant with dot":   workWith("ac.me", "batch"),
		"tenant star":       workWith("*", "batch"),
		"tenant gt":         workWith(">", "batch"),
		"tenant wildcard":   workWith("acme.*", "batch"),
		"tenant space":      workWith("ac me", "batch"),
		"tenant uppercase":  workWith("Acme", "batch"),
		"tenant empty":      workWith("", "batch"),
		"tenant leading -":  workWith("-acme", "batch"),
		"tenant too long":   workWith(strings.Repeat("a", 64), "batch"),
		"tenant newline":    workWith(`acme\n`, "batch"),
		"bad lane":          workWith("acme", "bulk"),
		"empty lane":        workWith("acme", ""),
		"uppercase lane":    workWith("acme", "Batch"),
		"missing workId":    `{"tenantId":"acme","region":"us","lane":"batch"}`,
		"missing region":    `{"workId":"w_1","tenantId":"acme","lane":"batch"}`,
		"oversize":          `{"workId":"` + strings.Repeat("w", event.MaxEventBytes) + `","tenantId":"acme","region":"us","lane":"batch"}`,
		"oversize padding":  goodWork + strings.Repeat(" ", event.MaxEventBytes),
		"duplicate decoded": goodWork + goodWork,
	}
	for name, body := range work {
		var w event.Work
		if err := event.Decode([]byte(body), &w); err == nil {
			t.Errorf("work %s: accepted %.80q", name, body)
		}
	}

	result := map[string]string{
		"missing attemptId":   `{"workId":"w_1","tenantId":"acme","leaseToken":"` + t1 + `","outcome":"ok"}`,
		"missing workId":      `{"attemptId":"` + a1 + `","tenantId":"acme","leaseToken":"` + t1 + `","outcome":"ok"}`,
		"missing leaseToken":  `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok"}`,
		"missing outcome":     `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","leaseToken":"` + t1 + `"}`,
		"bad tenant":          `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"a.>","leaseToken":"` + t1 + `","outcome":"ok"}`,
		"unknown field":       `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","leaseToken":"` + t1 + `","outcome":"ok","x":true}`,
		"trailing data":       goodResult + `1`,
		"attemptId not uuid":  `{"attemptId":"a1","workId":"w_1","tenantId":"acme","leaseToken":"` + t1 + `","outcome":"ok"}`,
		"leaseToken not uuid": `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","leaseToken":"t1","outcome":"ok"}`,
		"output in the event": `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","leaseToken":"` + t1 + `","outcome":"ok","output":"{}"}`,
	}
	for name, body := range result {
		var r event.Result
		if err := event.Decode([]byte(body), &r); err == nil {
			t.Errorf("result %s: accepted %q", name, body)
		}
	}

	attempt := map[string]string{
		"missing attemptId":       `{"workId":"w_1","tenantId":"acme","outcome":"ok"}`,
		"attemptId not uuid":      `{"attemptId":"a1","workId":"w_1","tenantId":"acme","outcome":"ok"}`,
		"missing workId":          `{"attemptId":"` + a1 + `","tenantId":"acme","outcome":"ok"}`,
		"missing outcome":         `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme"}`,
		"bad tenant":              `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"ACME","outcome":"ok"}`,
		"negative input":          `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","inputUnits":-1}`,
		"negative output":         `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","outputUnits":-1}`,
		"bad time":                `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","at":"yesterday"}`,
		"unknown field":           `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","costMicros":1}`,
		"trailing data":           goodAttempt + `"x"`,
		"neither call nor result": `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","noCall":true}`,
	}
	for name, body := range attempt {
		var a event.Attempt
		if err := event.Decode([]byte(body), &a); err == nil {
			t.Errorf("attempt %s: accepted %q", name, body)
		}
	}

	// A result the committer cannot take is refused to the committer
	// alone: the ledger still reads the call's usage.
	carried := map[string]string{
		"result of another work": `{"attemptId":"` + a1 + `","workId":"w_2","tenantId":"acme","outcome":"ok","inputUnits":10,"result":` + goodResult + `}`,
		"result without a lease": `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","inputUnits":10,"result":` +
			`{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok"}}`,
	}
	for name, body := range carried {
		if res, err := event.AttemptResult([]byte(body)); err == nil {
			t.Errorf("attempt with a %s: the committer took %+v", name, res)
		}
		if a, err := event.Parse[event.Attempt]([]byte(body)); err != nil || a.InputUnits != 10 {
			t.Errorf("attempt with a %s: the ledger read %+v, %v; want its usage", name, a, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{goodWork, goodResult, goodAttempt, `{}`, `null`, `{"tenantId":"a.b"}`, goodWork + `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var w event.Work
		if err := event.Decode(data, &w); err == nil {
			if !event.ValidToken(w.TenantID) || !event.ValidLane(w.Lane) || w.WorkID == "" || w.Region == "" {
				t.Fatalf("accepted work %+v from %q", w, data)
			}
			if s := (event.Names{Cell: "us"}).Work(w.Lane, w.TenantID); !strings.HasSuffix(s, "."+w.TenantID) ||
				strings.Count(w.TenantID, ".") != 0 {
				t.Fatalf("subject %q from accepted work", s)
			}
		}
		var r event.Result
		if err := event.Decode(data, &r); err == nil && !event.ValidToken(r.TenantID) {
			t.Fatalf("accepted result with tenant %q", r.TenantID)
		}
		var a event.Attempt
		if err := event.Decode(data, &a); err == nil && (!event.ValidToken(a.TenantID) || a.InputUnits < 0 || a.OutputUnits < 0 ||
			a.CachedInputUnits < 0 || a.ReasoningUnits < 0) {
			t.Fatalf("accepted attempt %+v", a)
		}
	})
}

func TestStreamsOnJetStream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	settings := event.StreamSettings{MaxAge: time.Hour, Duplicates: time.Minute}
	us := event.Names{Cell: "us"}

	if _, err := event.EnsureStream(ctx, js, nil, us, event.KindWork, settings); err != nil {
		t.Fatalf("first ensure stream: %v", err)
	}
	st, err := event.EnsureStream(ctx, js, nil, us, event.KindWork, settings)
	if err != nil {
		t.Fatalf("second ensure stream: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	cfg := info.Config
	if cfg.Name != "ASSAY_WORK_US" || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "assay.us.work.>" {
		t.Fatalf("stream %s subjects %v", cfg.Name, cfg.Subjects)
	}
	if cfg.Retention != jetstream.LimitsPolicy {
		t.Fatalf("retention = %v, want limits", cfg.Retention)
	}
	if cfg.MaxAge != time.Hour || cfg.Duplicates != time.Minute || cfg.Replicas != 1 {
		t.Fatalf("max age %v, duplicates %v, replicas %d; want 1h, 1m, 1", cfg.MaxAge, cfg.Duplicates, cfg.Replicas)
	}
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	if names.Err() != nil || len(streams) != 1 {
		t.Fatalf("streams = %v, %v; want only ASSAY_WORK_US", streams, names.Err())
	}

	defaults, err := event.EnsureStream(ctx, js, nil, us, event.KindResult, event.StreamSettings{})
	if err != nil {
		t.Fatalf("ensure result stream: %v", err)
	}
	dc := defaults.CachedInfo().Config
	if dc.MaxAge != 7*24*time.Hour || dc.Duplicates != 2*time.Minute || dc.Retention != jetstream.LimitsPolicy {
		t.Fatalf("default settings: max age %v, duplicates %v, retention %v", dc.MaxAge, dc.Duplicates, dc.Retention)
	}

	subject := us.Work(event.Batch, "acme")
	payload := []byte(goodWork)
	msgID := event.WorkMsgID("w_1", 1)
	first, err := js.Publish(ctx, subject, payload, jetstream.WithMsgID(msgID))
	if err != nil {
		t.Fatalf("first publish: %v", err)
	}
	second, err := js.Publish(ctx, subject, payload, jetstream.WithMsgID(msgID))
	if err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if first.Duplicate || !second.Duplicate || second.Sequence != first.Sequence {
		t.Fatalf("publish acks %+v then %+v, want the second a duplicate of the first", first, second)
	}
	if _, err := js.Publish(ctx, subject, payload, jetstream.WithMsgID(event.WorkMsgID("w_1", 2))); err != nil {
		t.Fatalf("publish next dispatch: %v", err)
	}
	info, err = st.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("stream holds %d messages, want 2 (one per distinct Nats-Msg-Id)", info.State.Msgs)
	}

	cs := event.ConsumerSettings{Durable: "classifier", AckWait: 5 * time.Second, Filter: "assay.us.work.batch.>"}
	if _, err := st.CreateOrUpdateConsumer(ctx, event.ConsumerConfig(cs)); err != nil {
		t.Fatalf("first ensure consumer: %v", err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, event.ConsumerConfig(cs))
	if err != nil {
		t.Fatalf("second ensure consumer: %v", err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	cc := ci.Config
	if cc.Durable != "classifier" || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.AckWait != 5*time.Second ||
		cc.MaxDeliver != 20 || cc.MaxAckPending != 64 || cc.FilterSubject != "assay.us.work.batch.>" {
		t.Fatalf("consumer config = %+v", cc)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("consumers before ensure = %d", info.State.Consumers)
	}
	info, err = st.Info(ctx)
	if err != nil || info.State.Consumers != 1 {
		t.Fatalf("stream has %v consumers (%v), want 1", info.State.Consumers, err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	var got [][]byte
	for m := range batch.Messages() {
		got = append(got, m.Data())
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	if len(got) != 2 || !bytes.Equal(got[0], payload) {
		t.Fatalf("fetched %d messages, want 2", len(got))
	}
}

// Replicas and placement come from the settings: a production cluster
// runs R3 streams placed on the servers of the cell's region.
func TestStreamConfigReplicasAndPlacement(t *testing.T) {
	t.Parallel()
	cfg := event.StreamConfig(event.Names{Cell: "eu"}, event.KindAttempt,
		event.StreamSettings{Replicas: 3, Placement: []string{"region:eu"}, MaxAge: 48 * time.Hour})
	if cfg.Replicas != 3 || cfg.Placement == nil || len(cfg.Placement.Tags) != 1 || cfg.Placement.Tags[0] != "region:eu" ||
		cfg.MaxAge != 48*time.Hour || cfg.Name != "ASSAY_ATTEMPT_EU" {
		t.Fatalf("config = %+v", cfg)
	}
	if d := event.StreamConfig(event.Names{Cell: "us"}, event.KindWork, event.StreamSettings{}); d.Placement != nil || d.Replicas != 1 {
		t.Fatalf("defaults: placement %+v, replicas %d", d.Placement, d.Replicas)
	}
}

// An attempt's cached and reasoning units travel as optional fields: an
// event with them decodes, negative ones are refused, and an event
// without them is written exactly as an earlier release wrote it, so a
// ledger or committer of that release, which refuses unknown fields,
// still reads it.
func TestAttemptUsageDetails(t *testing.T) {
	t.Parallel()
	with := `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","inputUnits":2000,"outputUnits":300,` +
		`"cachedInputUnits":1920,"reasoningUnits":192}`
	a, err := event.Parse[event.Attempt]([]byte(with))
	if err != nil || a.CachedInputUnits != 1920 || a.ReasoningUnits != 192 {
		t.Fatalf("attempt with usage details: %+v, %v", a, err)
	}
	for _, field := range []string{"cachedInputUnits", "reasoningUnits"} {
		bad := `{"attemptId":"` + a1 + `","workId":"w_1","tenantId":"acme","outcome":"ok","` + field + `":-1}`
		if _, err := event.Parse[event.Attempt]([]byte(bad)); err == nil {
			t.Errorf("negative %s accepted", field)
		}
	}
	plain, err := event.Parse[event.Attempt]([]byte(goodAttempt))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(plain)
	for _, field := range []string{"cachedInputUnits", "reasoningUnits"} {
		if bytes.Contains(raw, []byte(`"`+field+`"`)) {
			t.Errorf("an attempt without usage details writes %s, which an earlier release refuses: %s", field, raw)
		}
	}
}
