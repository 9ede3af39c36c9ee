package classifier_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/classifier"
)

// genaiBundle is the classifier alone, as newBundle builds it, started,
// with the telemetry it reports to and the simulated provider's address.
type genaiBundle struct {
	*bundle
	tel *telemetry.Provider
	// chatSpans are the model calls' spans ended so far, in order.
	chatSpans func() []chatSpan
	simHost   string
	simPort   int
}

// chatSpan is what the test reads of an exported span.
type chatSpan struct {
	Name     string
	SpanKind trace.SpanKind
	Attrs    map[attribute.Key]attribute.Value
}

func startGenAI(t *testing.T) *genaiBundle {
	t.Helper()
	st, dbURL := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme"})
	nc, err := nats.Connect(testenv.NATS(t))
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
	tel, exp := telemetrytest.Traced(t, "classifier", "us")
	// acme is past the cap on tenant labels: it is "other" wherever a
	// label names it.
	tel.LabelTenants([]string{"globex"})
	logs := &logBuffer{}
	svc, err := classifier.New(classifier.Config{Region: "us", Model: "assay-sim-1", BackoffBase: 10 * time.Millisecond},
		classifier.Deps{Store: st, JS: js, Model: &model.Client{BaseURL: sim.APIBase(simURL), Model: "assay-sim-1"},
			Contracts: reg, Log: slog.New(slog.NewJSONHandler(logs, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop(context.Background()) })
	if err := svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(simURL)
	port, _ := strconv.Atoi(u.Port())
	b := &genaiBundle{bundle: &bundle{svc: svc, st: st, db: testenv.Pool(t, dbURL), js: js, sim: s, log: logs},
		tel: tel, simHost: u.Hostname(), simPort: port}
	b.chatSpans = func() []chatSpan {
		var out []chatSpan
		for _, sp := range exp.GetSpans() {
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range sp.Attributes {
				attrs[kv.Key] = kv.Value
			}
			if _, ok := attrs["gen_ai.operation.name"]; ok {
				out = append(out, chatSpan{Name: sp.Name, SpanKind: sp.SpanKind, Attrs: attrs})
			}
		}
		return out
	}
	return b
}

// A real call to the simulated provider ends in a span named and
// attributed as the GenAI conventions (v1.41.0) say, beside assay's own
// attributes: its request, response, usage (cached and reasoning units
// included, as the provider reported them) and server, and the attempt's
// work, attempt, tenant label, contract and version.
func TestModelCallSpanFollowsGenAIConventions(t *testing.T) {
	t.Parallel()
	b := startGenAI(t)
	if err := b.sim.SetUsageDetails(sim.UsageDetails{CacheMinTokens: 32, CacheBlockTokens: 8, ReasoningTokens: 5}); err != nil {
		t.Fatal(err)
	}
	// The first call's prompt fills the provider's cache; the second,
	// of the same contract, starts with the same instructions.
	b.enqueue(t, "post-1", "buy now, free money")
	b.events(t, event.KindAttempt, 1)
	secondID := b.enqueue(t, "post-2", "a post about cats")
	var second event.Attempt
	for _, m := range b.events(t, event.KindAttempt, 2) {
		var att event.Attempt
		if err := event.Decode(m.Data, &att); err != nil {
			t.Fatal(err)
		}
		if att.WorkID == secondID {
			second = att
		}
	}
	spans := b.chatSpans()
	i := slices.IndexFunc(spans, func(sp chatSpan) bool { return sp.Attrs["assay.work_id"].AsString() == secondID })
	if len(spans) != 2 || i < 0 {
		t.Fatalf("chat spans %+v; want one for each of the 2 calls", spans)
	}
	sp := spans[i]
	if sp.Name != "chat assay-sim-1" || sp.SpanKind != trace.SpanKindClient {
		t.Fatalf("span %q of kind %v, want \"chat assay-sim-1\", a client span", sp.Name, sp.SpanKind)
	}
	cached := b.sim.Stats().Tenants["acme"].CachedPromptUnits
	want := map[attribute.Key]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "assay-sim-1",
		"gen_ai.response.model": "assay-sim-1", "gen_ai.output.type": "json", "gen_ai.request.max_tokens": int64(4096),
		"gen_ai.usage.input_tokens": second.InputUnits, "gen_ai.usage.output_tokens": second.OutputUnits,
		"gen_ai.usage.cache_read.input_tokens": cached, "gen_ai.usage.reasoning.output_tokens": int64(5),
		"server.address": b.simHost, "server.port": int64(b.simPort),
		"assay.work_id": secondID, "assay.attempt_id": second.AttemptID, "assay.tenant": telemetry.OtherTenants,
		"assay.contract": "moderation", "assay.contract_version": "moderation/1",
	}
	for k, v := range want {
		if got := sp.Attrs[k].AsInterface(); got != v {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got, got, v, v)
		}
	}
	if cached <= 0 {
		t.Errorf("the second prompt read nothing from the provider's cache")
	}
	if id := sp.Attrs["gen_ai.response.id"].AsString(); !strings.HasPrefix(id, "chatcmpl-sim-") {
		t.Errorf("gen_ai.response.id = %q", id)
	}
	if fr := sp.Attrs["gen_ai.response.finish_reasons"].AsStringSlice(); !slices.Equal(fr, []string{"stop"}) {
		t.Errorf("gen_ai.response.finish_reasons = %q", fr)
	}
	if _, ok := sp.Attrs["error.type"]; ok {
		t.Errorf("a call that succeeded has error.type %v", sp.Attrs["error.type"])
	}
}

// The classifier's /metrics serves gen_ai.client.token.usage and
// gen_ai.client.operation.duration as Prometheus names them, with the
// conventions' attributes and buckets; a failed call's duration carries
// error.type, here the 429's status.
func TestGenAIMetricsOnTheClassifiersMetrics(t *testing.T) {
	t.Parallel()
	b := startGenAI(t)
	if err := b.sim.AddFault(sim.Fault{Kind: sim.FaultRateLimit, Tenant: "acme", Match: "slow down", Times: 1}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "post-limited", "slow down")
	b.events(t, event.KindAttempt, 2) // the 429 and its retry
	rec := httptest.NewRecorder()
	b.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	const common = `gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="assay-sim-1"`
	for _, want := range []struct{ name, labels string }{
		{"gen_ai_client_token_usage_bucket", `gen_ai_token_type="input"`},
		{"gen_ai_client_token_usage_bucket", `gen_ai_token_type="output"`},
		{"gen_ai_client_token_usage_bucket", `le="6.7108864e+07"`},
		{"gen_ai_client_operation_duration_seconds_bucket", `le="81.92"`},
		{"gen_ai_client_operation_duration_seconds_bucket", `error_type="429"`},
		{"gen_ai_client_operation_duration_seconds_count", `gen_ai_response_model="assay-sim-1"`},
	} {
		if line := seriesLine(body, want.name, common, want.labels, `tenant="other"`, `server_address="`+b.simHost+`"`,
			`server_port="`+strconv.Itoa(b.simPort)+`"`, `otel_scope_schema_url="https://opentelemetry.io/schemas/1.41.0"`); line == "" {
			t.Errorf("no %s series with %s and %s", want.name, common, want.labels)
		} else {
			t.Logf("%s", line)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// seriesLine is the first line of body naming a series of name that has
// every one of labels, "" when there is none.
func seriesLine(body, name string, labels ...string) string {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			return line
		}
	}
	return ""
}
