package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"assay.dev/pkg/consumer"
)

// TestStepDecidesEachError: nil is done; a permanent error is given up
// once and done; any other error is retried after Wait and given up never.
func TestStepDecidesEachError(t *testing.T) {
	permanent := errors.New("refused for good")
	var gaveUp []error
	r := consumer.Step[string]{Log: slog.New(slog.DiscardHandler), Failed: "step failed; will retry",
		Attrs: func(v string) []any { return []any{"key", v} }, Wait: 3 * time.Second,
		Permanent: func(err error) bool { return errors.Is(err, permanent) },
		GiveUp:    func(_ context.Context, _ string, err error) { gaveUp = append(gaveUp, err) }}
	for _, c := range []struct {
		err  error
		want consumer.Disposition
		gave int
	}{
		{nil, consumer.Done(), 0},
		{permanent, consumer.Done(), 1},
		{errors.New("database gone"), consumer.Retry(3 * time.Second), 1},
	} {
		got := r.Settle(t.Context(), "k", c.err)
		if got != c.want || len(gaveUp) != c.gave {
			t.Errorf("%v: %+v with %d given up, want %+v with %d", c.err, got, len(gaveUp), c.want, c.gave)
		}
	}
	// Without Permanent every error is retried.
	r.Permanent = nil
	if got := r.Settle(t.Context(), "k", permanent); got != consumer.Retry(3*time.Second) {
		t.Errorf("no Permanent: %+v, want a retry", got)
	}
}
