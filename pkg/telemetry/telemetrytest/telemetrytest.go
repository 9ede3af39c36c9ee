// Package telemetrytest gives a test the telemetry a service process
// sets up.
package telemetrytest

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"assay.dev/pkg/telemetry"
)

// Provider is service's telemetry in region, as its process sets it up,
// shut down when the test ends.
func Provider(t testing.TB, service, region string) *telemetry.Provider {
	t.Helper()
	tel, err := telemetry.Setup(t.Context(), service, region)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

// Traced is Provider with every span it ends kept in the exporter it
// returns, for the test to read.
func Traced(t testing.TB, service, region string) (*telemetry.Provider, *tracetest.InMemoryExporter) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(t.Context(), service, region,
		telemetry.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(spans)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel, spans
}
