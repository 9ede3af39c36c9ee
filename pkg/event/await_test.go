package event_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/event"
)

func apiErr(code, errCode int, desc string) error {
	return fmt.Errorf("event: stream X: %w", &jetstream.APIError{Code: code, ErrorCode: jetstream.ErrorCode(errCode), Description: desc})
}

// What a forming or failing-over cluster answers is waited out; what no
// wait mends is not.
func TestUnready(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"no suitable peers", apiErr(400, 10005, "no suitable peers for placement, peer offline"), true},
		{"temporarily unavailable", apiErr(503, 10008, "JetStream system temporarily unavailable"), true},
		{"not the leader", apiErr(500, 10009, "JetStream not the leader"), true},
		{"stream offline", apiErr(500, 10118, "stream is offline"), true},
		{"another 503", apiErr(503, 10999, "unavailable"), true},
		{"a request unanswered", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"a request timed out", nats.ErrTimeout, true},
		{"no responders", nats.ErrNoResponders, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"replicas not supported", apiErr(500, 10074, "replicas > 1 not supported in non-clustered mode"), false},
		{"subjects overlap", apiErr(400, 10065, "subjects overlap with an existing stream"), false},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, false},
		{"not enabled for the account", jetstream.ErrJetStreamNotEnabledForAccount, false},
		{"permission", nats.ErrPermissionViolation, false},
		{"canceled", context.Canceled, false},
		{"nil", nil, false},
	} {
		if got := event.Unready(tc.err); got != tc.want {
			t.Errorf("%s: Unready(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestAwait(t *testing.T) {
	t.Parallel()
	unready := apiErr(503, 10008, "JetStream system temporarily unavailable")
	t.Run("waits out a cluster until it answers", func(t *testing.T) {
		t.Parallel()
		var logs bytes.Buffer
		tries := 0
		err := event.Await(t.Context(), slog.New(slog.NewJSONHandler(&logs, nil)), "stream X", time.Minute, func(context.Context) error {
			if tries++; tries < 3 {
				return unready
			}
			return nil
		})
		if err != nil || tries != 3 {
			t.Fatalf("err %v after %d tries; want nil after 3", err, tries)
		}
		if n := strings.Count(logs.String(), `"msg":"waiting for jetstream"`); n != 2 {
			t.Fatalf("%d waits logged, want 2:\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), `"for":"stream X"`) || !strings.Contains(logs.String(), "10008") {
			t.Fatalf("a wait does not say what it waits for and why:\n%s", logs.String())
		}
	})
	t.Run("gives up at once on what no wait mends", func(t *testing.T) {
		t.Parallel()
		tries := 0
		refused := apiErr(500, 10074, "replicas > 1 not supported in non-clustered mode")
		err := event.Await(t.Context(), nil, "stream X", time.Hour, func(context.Context) error { tries++; return refused })
		if tries != 1 || !errors.Is(err, refused) || !strings.HasPrefix(err.Error(), "stream X: ") {
			t.Fatalf("%d tries, err %v; want one try and the refusal, naming the stream", tries, err)
		}
	})
	t.Run("gives up when the wait has passed", func(t *testing.T) {
		t.Parallel()
		tries := 0
		err := event.Await(t.Context(), nil, "bucket B", 600*time.Millisecond, func(context.Context) error { tries++; return unready })
		if !errors.Is(err, unready) || tries < 2 || !strings.Contains(err.Error(), "bucket B: JetStream not ready after") {
			t.Fatalf("%d tries, err %v; want several tries, then the last error naming the bucket and the wait", tries, err)
		}
	})
	t.Run("a negative wait tries once", func(t *testing.T) {
		t.Parallel()
		tries := 0
		err := event.Await(t.Context(), nil, "bucket B", -1, func(context.Context) error { tries++; return unready })
		if tries != 1 || !errors.Is(err, unready) {
			t.Fatalf("%d tries, err %v; want one try", tries, err)
		}
	})
	t.Run("a canceled context ends the wait", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		tries := 0
		err := event.Await(ctx, nil, "stream X", time.Hour, func(context.Context) error {
			if tries++; tries == 2 {
				cancel()
			}
			return unready
		})
		if tries != 2 || !errors.Is(err, unready) {
			t.Fatalf("%d tries, err %v; want the wait to end with the context", tries, err)
		}
	})
}
