package testenv

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

// DecisionLog is a JSON log a service under test writes to (through
// slog.NewJSONHandler) and the test reads its decisions back from: the
// lines telemetry.Decision writes, message "decision".
type DecisionLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Decision is one decision line: the key it is about (and the attempt,
// when it names one), its outcome word and its reason.
type Decision struct {
	Key, Attempt, Outcome, Reason string
}

// Write takes one log line; several services may write at once.
func (l *DecisionLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Decisions are the decisions logged so far, in the order they were made.
// A line that is not JSON fails the test.
func (l *DecisionLog) Decisions(tb testing.TB) []Decision {
	tb.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Decision
	for line := range strings.Lines(l.b.String()) {
		var d struct {
			Msg string
			Decision
		}
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			tb.Fatalf("testenv: log line %q: %v", line, err)
		}
		if d.Msg == "decision" {
			out = append(out, d.Decision)
		}
	}
	return out
}

// OutcomesOf are the outcomes of the decisions about id, their key or the
// attempt they name, in the order they were made.
func (l *DecisionLog) OutcomesOf(tb testing.TB, id string) []string {
	tb.Helper()
	var out []string
	for _, d := range l.Decisions(tb) {
		if d.Key == id || d.Attempt == id {
			out = append(out, d.Outcome)
		}
	}
	return out
}
