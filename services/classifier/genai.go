package classifier

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
	"go.opentelemetry.io/otel/trace"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/model"
	"assay.dev/pkg/store"
)

// The model call's span and the GenAI client metrics follow the
// OpenTelemetry semantic conventions for generative AI of semconv v1.41.0
// (semconv.SchemaURL, declared by their tracer and meter): the newest the
// go.opentelemetry.io/otel in go.mod ships with its GenAI names, which
// v1.42.0 no longer carries.

// chatOperation is gen_ai.operation.name of a chat-completions call.
var chatOperation = genaiconv.OperationNameChat

// GenAITokenBuckets and GenAIDurationBuckets are the bucket boundaries the
// conventions recommend for gen_ai.client.token.usage and
// gen_ai.client.operation.duration (seconds).
var (
	GenAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	GenAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
)

// chatCall is one model call as the GenAI conventions describe it: who is
// asked, where, for which model.
type chatCall struct {
	provider genaiconv.ProviderNameAttr
	model    string // gen_ai.request.model
	address  string // server.address, "" when the endpoint is not known
	port     int
}

// chatOf is the call an attempt at w makes to the cell's model client.
func (s *Service) chatOf(w *store.Work) chatCall {
	cc := chatCall{provider: genaiconv.ProviderNameAttr(model.DefaultProvider), model: s.modelOf(w)}
	if p, ok := s.d.Model.(interface{ ProviderName() string }); ok {
		cc.provider = genaiconv.ProviderNameAttr(p.ProviderName())
	}
	if e, ok := s.d.Model.(interface{ ChatURL() string }); ok {
		cc.address, cc.port = serverOf(e.ChatURL())
	}
	return cc
}

// serverOf is the host and port a URL asks, the port its scheme's default
// when it names none; "" when it does not parse.
func serverOf(raw string) (string, int) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return "", 0
	}
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		port, _ = net.LookupPort("tcp", u.Scheme)
	}
	return u.Hostname(), port
}

// attrs are the attributes the call's span and metrics share beside its
// operation and provider.
func (cc chatCall) attrs() []attribute.KeyValue {
	kv := []attribute.KeyValue{semconv.GenAIRequestModel(cc.model)}
	if cc.address != "" {
		kv = append(kv, semconv.ServerAddress(cc.address), semconv.ServerPort(cc.port))
	}
	return kv
}

// startChat starts the span of one model call for attempt attemptID at w
// under c: "chat {model}", a client span, with the request's GenAI
// attributes and assay's own (the tenant as its metric label, capped).
func (s *Service) startChat(ctx context.Context, w *store.Work, c *contract.Contract, attemptID string,
	cc chatCall) (context.Context, trace.Span) {
	attrs := append(cc.attrs(), semconv.GenAIOperationNameKey.String(string(chatOperation)),
		semconv.GenAIProviderNameKey.String(string(cc.provider)),
		semconv.GenAIOutputTypeJSON, semconv.GenAIRequestMaxTokens(s.outputCap(w)),
		attribute.String("assay.work_id", w.ID), attribute.String("assay.attempt_id", attemptID),
		attribute.String("assay.tenant", s.d.Tel.Tenant(w.TenantID)), attribute.String("assay.contract", c.Name),
		attribute.String("assay.contract_version", c.SchemaVersion))
	return s.d.Tel.TracerFor(semconv.SchemaURL).Start(ctx, string(chatOperation)+" "+cc.model,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endChat sets on the call's span what the provider answered: the
// response's id, model and finish reasons, its usage, and, on failure,
// error.type.
func endChat(span trace.Span, reply *model.Reply, err error) {
	if answered(reply) {
		span.SetAttributes(semconv.GenAIResponseModel(reply.Model), semconv.GenAIResponseFinishReasons(reply.FinishReasons...))
		if reply.ID != "" {
			span.SetAttributes(semconv.GenAIResponseID(reply.ID))
		}
	}
	if u, ok := usageOf(reply); ok {
		span.SetAttributes(semconv.GenAIUsageInputTokens(u.PromptTokens), semconv.GenAIUsageOutputTokens(u.CompletionTokens),
			semconv.GenAIUsageCacheReadInputTokens(u.CachedInputTokens()),
			semconv.GenAIUsageReasoningOutputTokens(u.ReasoningTokens()))
	}
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		span.SetStatus(codes.Error, err.Error())
	}
}

// answered reports whether a chat completion was read of reply: its model
// is then the one that answered.
func answered(reply *model.Reply) bool {
	return reply != nil && (reply.ID != "" || len(reply.FinishReasons) > 0)
}

// usageOf is the usage the provider reported, ok=false when it reported
// none, or counts no call can have (the ledger charges those estimated).
func usageOf(reply *model.Reply) (model.Usage, bool) {
	if reply == nil {
		return model.Usage{}, false
	}
	u := reply.Usage
	return u, u.PromptTokens+u.CompletionTokens > 0 && u.PromptTokens >= 0 && u.CompletionTokens >= 0
}

// errorType is error.type of a failed call, low in cardinality: the HTTP
// status of a non-2xx answer ("429", "500"), else what the adapter found
// (model.Kind: "timeout", "canceled", "transport_error", "malformed",
// "refused", "content_filtered", "truncated", "tool_call",
// "transport_rejected"), and "_OTHER" for an error that is not the
// adapter's.
func errorType(err error) string {
	var mErr *model.Error
	switch {
	case !errors.As(err, &mErr):
		return semconv.ErrorTypeOther.Value.AsString()
	case mErr.Status != 0 && (mErr.Status < 200 || mErr.Status > 299):
		return strconv.Itoa(mErr.Status)
	}
	return string(mErr.Kind)
}

// chat records one call in gen_ai.client.operation.duration and,
// when the provider reported usage, gen_ai.client.token.usage (input and
// output), with the cell's region, the tenant's label and the contract
// beside the conventions' attributes.
func (m *metrics) chat(ctx context.Context, cc chatCall, w *store.Work, reply *model.Reply, err error, took time.Duration) {
	attrs := append(cc.attrs(), m.region, attribute.String("tenant", m.tel.Tenant(w.TenantID)),
		attribute.String("contract", w.Contract))
	if answered(reply) {
		attrs = append(attrs, semconv.GenAIResponseModel(reply.Model))
	}
	if u, ok := usageOf(reply); ok {
		m.tokenUsage.Record(ctx, int64(u.PromptTokens), chatOperation, cc.provider, genaiconv.TokenTypeInput, attrs...)
		m.tokenUsage.Record(ctx, int64(u.CompletionTokens), chatOperation, cc.provider, genaiconv.TokenTypeOutput, attrs...)
	}
	if err != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(err)))
	}
	m.opDuration.Record(ctx, took.Seconds(), chatOperation, cc.provider, attrs...)
}
