// Package telemetry sets up OpenTelemetry traces and metrics for one assay
// service in one region, carries trace context across NATS messages, and
// writes the structured logs every service shares.
package telemetry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"

	"assay.dev/pkg/buildinfo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// propagator is fixed rather than read from the global so that Inject and
// Extract always speak W3C, whatever else a process installs.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Provider owns one service's tracer and meter providers. Several may live in
// one process (dev mode runs every service of every region together), so
// nothing here depends on the global tracer or meter provider.
type Provider struct {
	tp       *sdktrace.TracerProvider
	mp       *sdkmetric.MeterProvider
	tracer   trace.Tracer
	meter    metric.Meter
	scope    string
	registry *prometheus.Registry
	handler  http.Handler
	tenants  tenantLabels

	shutdownOnce sync.Once
	shutdownErr  error
}

// Setup builds the providers for service ("ingress", "classifier", ...) in
// region. Traces are exported only when OTEL_TRACES_EXPORTER names an
// exporter; metrics are always served by MetricsHandler and additionally
// pushed when OTEL_METRICS_EXPORTER names a push exporter.
func Setup(ctx context.Context, service, region string, opts ...Option) (*Provider, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if service == "" {
		return nil, errors.New("telemetry: service name is empty")
	}
	cell := o.cell
	if cell == "" {
		cell = region
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", "assay-"+service),
		attribute.String("cloud.region", region),
		attribute.String(cellLabel, cell),
	))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	otel.SetTextMapPropagator(propagator)

	p := &Provider{registry: prometheus.NewRegistry()}
	p.tenants = tenantLabels{max: DefaultTenantLabels}
	if o.tenants > 0 {
		p.tenants.max = o.tenants
	}

	traceOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if named(os.Getenv("OTEL_TRACES_EXPORTER")) {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER: %w", err)
		}
		traceOpts = append(traceOpts, sdktrace.WithBatcher(exp))
	}
	for _, sp := range o.spans {
		traceOpts = append(traceOpts, sdktrace.WithSpanProcessor(sp))
	}
	// Without an exporter spans are still created with real ids, so trace
	// context flows through logs and message headers.
	p.tp = sdktrace.NewTracerProvider(traceOpts...)

	// Every series carries the cell beside the region its own attributes
	// name, so a region of several cells is told apart on the dashboards.
	promExp, err := otelprom.New(otelprom.WithRegisterer(p.registry),
		otelprom.WithResourceAsConstantLabels(func(kv attribute.KeyValue) bool { return kv.Key == cellLabel }))
	if err != nil {
		_ = p.tp.Shutdown(ctx)
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	meterOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	// "prometheus" would make autoexport start its own HTTP server; this
	// provider already serves MetricsHandler.
	if v := os.Getenv("OTEL_METRICS_EXPORTER"); named(v) && strings.TrimSpace(v) != "prometheus" {
		reader, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			_ = p.tp.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: OTEL_METRICS_EXPORTER: %w", err)
		}
		meterOpts = append(meterOpts, sdkmetric.WithReader(reader))
	}
	p.mp = sdkmetric.NewMeterProvider(meterOpts...)

	p.scope = "assay.dev/" + service
	p.tracer = p.tp.Tracer(p.scope)
	p.meter = p.mp.Meter(p.scope)

	p.registerRuntime(service, region, cell)
	p.handler = promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{Registry: p.registry})
	return p, nil
}

// registerRuntime adds the Go runtime's and the process's collectors (per
// registry, so each service's /metrics is complete on its own) and the
// build that runs, as a constant 1 with the version in its labels.
func (p *Provider) registerRuntime(service, region, cell string) {
	p.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bi := buildinfo.Read()
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "assay_build_info",
		Help:        "The running build: version, VCS revision and Go version; always 1.",
		ConstLabels: prometheus.Labels{"service": service, "region": region, cellLabel: cell, "version": bi.Version, "revision": bi.RevisionOrUnknown(), "goversion": bi.GoVersion}})
	build.Set(1)
	p.registry.MustRegister(build)
}

// Option adjusts Setup.
type Option func(*options)

type options struct {
	spans   []sdktrace.SpanProcessor
	tenants int
	cell    string
}

// cellLabel is the label, and the resource attribute, naming the cell every
// metric of a service comes from.
const cellLabel = "cell"

// WithCell names the cell the service serves (ASSAY_CELL); every metric
// carries it as the label "cell". Default: the region, as a region of one
// cell names its cell.
func WithCell(cell string) Option {
	return func(o *options) { o.cell = cell }
}

// WithTenantLabels lets n tenants have a metric label of their own (see
// LabelTenants) and counts the rest as "other" (ASSAY_METRICS_TENANTS).
func WithTenantLabels(n int) Option {
	return func(o *options) { o.tenants = n }
}

// WithSpanProcessor hands every span to sp as well, beside any exporter
// OTEL_TRACES_EXPORTER names; a test reads the spans a cell made through
// one.
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(o *options) { o.spans = append(o.spans, sp) }
}

func named(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && v != "none"
}

// Tracer returns the service's tracer.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// Meter returns the service's meter.
func (p *Provider) Meter() metric.Meter { return p.meter }

// TracerFor is the service's tracer for spans that follow the semantic
// conventions at schemaURL (a semconv package's SchemaURL): it declares
// the version, so a collector knows what the names mean.
func (p *Provider) TracerFor(schemaURL string) trace.Tracer {
	return p.tp.Tracer(p.scope, trace.WithSchemaURL(schemaURL))
}

// MeterFor is the service's meter for instruments that follow the
// semantic conventions at schemaURL; their series carry it as
// otel_scope_schema_url.
func (p *Provider) MeterFor(schemaURL string) metric.Meter {
	return p.mp.Meter(p.scope, metric.WithSchemaURL(schemaURL))
}

// MetricsHandler serves this provider's metrics in the Prometheus text format.
func (p *Provider) MetricsHandler() http.Handler { return p.handler }

// Shutdown flushes and stops the exporters. Later calls return the first
// call's result.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		p.shutdownErr = errors.Join(p.tp.Shutdown(ctx), p.mp.Shutdown(ctx))
	})
	return p.shutdownErr
}

// headerCarrier adapts nats.Header, whose keys are case-sensitive, to the
// propagation carrier.
type headerCarrier nats.Header

func (c headerCarrier) Get(key string) string {
	if v := nats.Header(c).Get(key); v != "" {
		return v
	}
	// Other publishers may have written Traceparent or TRACEPARENT.
	for k, vs := range c {
		if strings.EqualFold(k, key) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the W3C traceparent, tracestate and baggage of ctx into h.
// h must be non-nil (nats.Msg.Header is nil until set); a nil h is ignored.
func Inject(ctx context.Context, h nats.Header) {
	if h == nil {
		return
	}
	propagator.Inject(ctx, headerCarrier(h))
}

// Extract returns ctx carrying the remote span context and baggage found in h.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return propagator.Extract(ctx, headerCarrier(h))
}

// traceOnly carries the W3C trace context alone: what crosses a boundary
// with a party outside the cell (a caller, the model provider), where
// baggage is not trusted in, nor handed out.
var traceOnly = propagation.TraceContext{}

// FromCaller continues a caller's W3C traceparent (and tracestate) from
// HTTP headers h; a malformed one is ignored and a new trace starts.
func FromCaller(ctx context.Context, h http.Header) context.Context {
	return traceOnly.Extract(ctx, propagation.HeaderCarrier(h))
}

// ToProvider sets the traceparent of the span in ctx on an outgoing HTTP
// request's headers h.
func ToProvider(ctx context.Context, h http.Header) {
	traceOnly.Inject(ctx, propagation.HeaderCarrier(h))
}

// Traceparent is the W3C traceparent of the span in ctx, "" when there is
// none: what a work row keeps so a later announcement can link to it.
func Traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	traceOnly.Inject(ctx, c)
	return c["traceparent"]
}

// Link is a span link to the trace a traceparent names; ok=false when it
// names none.
func Link(traceparent string) (trace.Link, bool) {
	ctx := traceOnly.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	return trace.Link{SpanContext: sc}, sc.IsValid()
}

// NewLogger returns a JSON logger whose every line names service and region
// once: a logger derived With("service", …) or With("region", …) replaces
// them rather than repeating the key. Durations are written as Go
// durations ("1.5s"), not nanoseconds.
func NewLogger(w io.Writer, service, region string, level slog.Level) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			return slog.String(a.Key, a.Value.Duration().String())
		}
		return a
	}})
	return slog.New(cellHandler{inner: h, service: service, region: region})
}

// cellHandler is a handler that holds the service and region of every line apart
// from the other attributes, so each is written once.
type cellHandler struct {
	inner           slog.Handler
	service, region string
}

func (n cellHandler) Enabled(ctx context.Context, l slog.Level) bool { return n.inner.Enabled(ctx, l) }

func (n cellHandler) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(slog.String("service", n.service), slog.String("region", n.region))
	return n.inner.Handle(ctx, r)
}

func (n cellHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	rest := make([]slog.Attr, 0, len(attrs))
	for _, a := range attrs {
		switch a.Key {
		case "service":
			n.service = a.Value.String()
		case "region":
			n.region = a.Value.String()
		default:
			rest = append(rest, a)
		}
	}
	if len(rest) > 0 {
		n.inner = n.inner.WithAttrs(rest)
	}
	return n
}

func (n cellHandler) WithGroup(name string) slog.Handler {
	n.inner = n.inner.WithGroup(name)
	return n
}

// Opaque is an identifier the caller chose (a source id, a revision, an
// item id, a delivery id) as logs and spans carry it: the first bytes of
// its SHA-256. Such an id can hold anything (a name, an address), and logs
// leave the cell; an operator who has the id finds its lines by the same
// digest (sha256 of the id, the first 12 hex digits).
func Opaque(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:6])
}

// OpaqueAttr is Opaque as a log attribute.
func OpaqueAttr(key, id string) slog.Attr { return slog.String(key, Opaque(id)) }

// Decision logs one decision line: what was decided about key and why, tied
// to the current trace when there is one.
func Decision(ctx context.Context, log *slog.Logger, key, outcome, reason string, attrs ...slog.Attr) {
	if log == nil {
		log = slog.Default()
	}
	all := make([]slog.Attr, 0, 5+len(attrs))
	all = append(all, slog.String("key", key), slog.String("outcome", outcome), slog.String("reason", reason))
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		all = append(all, slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	all = append(all, attrs...)
	log.LogAttrs(ctx, slog.LevelInfo, "decision", all...)
}
