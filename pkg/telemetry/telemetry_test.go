package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

func setup(t *testing.T, service string) *Provider {
	t.Helper()
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_METRICS_EXPORTER", "")
	p, err := Setup(context.Background(), service, "eu-1")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return p
}

func TestInjectExtractRoundTrip(t *testing.T) {
	p := setup(t, "ingress")
	ctx, span := p.Tracer().Start(context.Background(), "publish")
	defer span.End()
	member, _ := baggage.NewMember("tenant", "t1")
	bag, _ := baggage.New(member)
	ctx = baggage.ContextWithBaggage(ctx, bag)

	h := nats.Header{}
	Inject(ctx, h)
	if h.Get("traceparent") == "" {
		t.Fatalf("no traceparent in %v", h)
	}

	// The message crosses the wire as bytes; rebuild the header as a
	// subscriber would see it.
	msg := nats.NewMsg("x")
	for k, vs := range h {
		for _, v := range vs {
			msg.Header.Add(k, v)
		}
	}
	got := Extract(context.Background(), msg.Header)
	rsc := trace.SpanContextFromContext(got)
	if !rsc.IsRemote() || rsc.TraceID() != span.SpanContext().TraceID() || rsc.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("extracted %v, want trace %v span %v", rsc, span.SpanContext().TraceID(), span.SpanContext().SpanID())
	}
	if v := baggage.FromContext(got).Member("tenant").Value(); v != "t1" {
		t.Fatalf("baggage tenant = %q", v)
	}

	// A child started from the extracted context continues the trace in
	// another service's provider.
	other := setup(t, "classifier")
	_, child := other.Tracer().Start(got, "consume")
	defer child.End()
	if child.SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Fatal("child span left the trace")
	}
}

func TestExtractToleratesCaseAndNil(t *testing.T) {
	h := nats.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	sc := trace.SpanContextFromContext(Extract(context.Background(), h))
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id %v", sc.TraceID())
	}
	ctx := context.Background()
	if Extract(ctx, nil) != ctx {
		t.Fatal("nil header changed the context")
	}
	Inject(ctx, nil) // must not panic
}

func TestMetricsHandlerExposesCounter(t *testing.T) {
	p := setup(t, "ledger")
	other := setup(t, "committer")
	c, err := p.Meter().Int64Counter("assay.test.admitted")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)

	rec := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	if rec.Code != 200 || !strings.Contains(body, "assay_test_admitted_total") || !strings.Contains(body, `service_name="assay-ledger"`) {
		t.Fatalf("status %d, body:\n%s", rec.Code, body)
	}
	if !strings.Contains(body, `cloud_region="eu-1"`) {
		t.Fatalf("no region label:\n%s", body)
	}

	// Providers in one process keep their metrics apart.
	rec = httptest.NewRecorder()
	other.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), "assay_test_admitted") {
		t.Fatal("counter leaked into another provider")
	}
}

func TestShutdownIdempotent(t *testing.T) {
	p := setup(t, "ingress")
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupRejectsUnknownExporter(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "no-such-exporter")
	if p, err := Setup(context.Background(), "ingress", "eu-1"); err == nil {
		p.Shutdown(context.Background())
		t.Fatal("expected an error")
	}
}

func TestSetupWithConsoleExporters(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	t.Setenv("OTEL_METRICS_EXPORTER", "prometheus")
	p, err := Setup(context.Background(), "ingress", "eu-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestDecision(t *testing.T) {
	p := setup(t, "classifier")
	var buf bytes.Buffer
	log := NewLogger(&buf, "classifier", "eu-1", slog.LevelInfo)
	ctx, span := p.Tracer().Start(context.Background(), "classify")
	Decision(ctx, log, "work-1", "retry", "rate_limited", slog.Int("attempt", 2))
	span.End()
	Decision(context.Background(), log, "work-2", "done", "ok")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines:\n%s", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"msg": "decision", "level": "INFO", "service": "classifier", "region": "eu-1",
		"key": "work-1", "outcome": "retry", "reason": "rate_limited", "attempt": float64(2),
		"trace_id": span.SpanContext().TraceID().String(), "span_id": span.SpanContext().SpanID().String(),
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	m = nil
	if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["trace_id"]; ok {
		t.Errorf("trace_id without a span: %s", lines[1])
	}
}

func TestNewLoggerLevel(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, "s", "r", slog.LevelWarn)
	log.Info("hidden")
	log.Warn("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "shown") {
		t.Fatalf("output %q", out)
	}
}

// Each line names its service and region once, whatever a caller added,
// and durations read as durations.
func TestLoggerNamesServiceAndRegionOnce(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, "dev", "", slog.LevelInfo).With("region", "us").With("service", "classifier", "key", "w_1")
	log.Info("decision", "delay", 1500*time.Millisecond)
	line := buf.String()
	if strings.Count(line, `"service"`) != 1 || strings.Count(line, `"region"`) != 1 ||
		!strings.Contains(line, `"service":"classifier"`) || !strings.Contains(line, `"region":"us"`) ||
		!strings.Contains(line, `"key":"w_1"`) || !strings.Contains(line, `"delay":"1.5s"`) {
		t.Fatalf("log line %s", line)
	}
}

// TestEveryMetricNamesItsCell: a service of cell us-2 labels each of its
// series, and the build info, with cell="us-2"; without WithCell the cell
// is the region.
func TestEveryMetricNamesItsCell(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want string
	}{{[]Option{WithCell("us-2")}, "us-2"}, {nil, "us"}} {
		p, err := Setup(t.Context(), "ledger", "us", c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown(context.Background()) })
		n, err := p.Meter().Int64Counter("assay.test.celled")
		if err != nil {
			t.Fatal(err)
		}
		n.Add(t.Context(), 1, metric.WithAttributes(attribute.String("region", "us")))
		rec := httptest.NewRecorder()
		p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		var series int
		for _, line := range strings.Split(rec.Body.String(), "\n") {
			if !strings.HasPrefix(line, "assay_test_celled_total{") && !strings.HasPrefix(line, "assay_build_info{") {
				continue
			}
			series++
			if !strings.Contains(line, `cell="`+c.want+`"`) {
				t.Errorf("%s: want cell=%q", line, c.want)
			}
		}
		if series != 2 {
			t.Errorf("found %d of the 2 series:\n%s", series, rec.Body.String())
		}
	}
}
