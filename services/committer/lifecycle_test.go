package committer_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/lifecycle/lifecycletest"
	"assay.dev/pkg/telemetry/telemetrytest"
	"assay.dev/services/committer"
)

// stressCell is setupCell's cell with the ATTEMPT and RESULT streams the
// classifier would have made and answers waiting in ATTEMPT for a verdict,
// so the first committers stopped hold results.
func stressCell(t *testing.T, answers int) *bundle {
	t.Helper()
	b := setupCell(t)
	for _, kind := range []string{event.KindAttempt, event.KindResult} {
		if _, err := event.EnsureStream(t.Context(), b.js, nil, names, kind, event.StreamSettings{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range answers {
		ev := b.claimed(t, fmt.Sprintf("stress-%012d", i))
		b.answered(t, ev, `{"category":"spam","confidence":0.9,"needsHumanReview":false}`)
		b.publish(t, ev)
	}
	return b
}

// committerOf builds a committer of the cell, not started, with its own
// telemetry as each process has and its tickers passing often; js, when
// set, is the JetStream it is given.
func (b *bundle) committerOf(t *testing.T, js committer.JetStream) *committer.Service {
	t.Helper()
	reg, err := contract.Load()
	if err != nil {
		t.Fatal(err)
	}
	tel := telemetrytest.Provider(t, "committer", "us")
	if js == nil {
		js = b.js
	}
	svc, err := committer.New(committer.Config{Region: "us", ReapEvery: 5 * time.Millisecond, AnnounceEvery: 5 * time.Millisecond,
		PublishRetryEvery: 5 * time.Millisecond, PublishCountEvery: 5 * time.Millisecond},
		committer.Deps{Store: b.st, JS: js, Contracts: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Tel: tel})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestServiceLifecycle holds a whole committer (its OUTCOME stream, relay,
// publisher, result consumers, reaper and announcer) to the contract of
// every part, with answers to commit while it starts and stops.
func TestServiceLifecycle(t *testing.T) {
	b := stressCell(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service { return b.committerOf(t, nil) })
}

// TestWarmServiceLifecycle is the same with each Stop meeting a ready
// committer, which consumes: the first ones stopped hold results.
func TestWarmServiceLifecycle(t *testing.T) {
	b := stressCell(t, 20)
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		s := b.committerOf(t, nil)
		return lifecycletest.Warm(s, s.Ready)
	})
	var open int
	if err := b.db.QueryRow(t.Context(), `SELECT count(*) FROM work WHERE state = 'running'`).Scan(&open); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 20 answers still wait for a verdict", open)
}

// TestPublisherLifecycle holds the committer's publisher, on its OUTCOME
// durable, to the contract of every part, each Stop meeting it consuming.
func TestPublisherLifecycle(t *testing.T) {
	b := stressCell(t, 0)
	if _, err := event.EnsureStream(t.Context(), b.js, nil, names, event.KindOutcome, event.StreamSettings{}); err != nil {
		t.Fatal(err)
	}
	lifecycletest.Stress(t, func(t *testing.T) lifecycle.Service {
		p := b.committerOf(t, nil).Publisher()
		return lifecycletest.Warm(p, p.Ready)
	})
}

// slowConn is the cell's JetStream whose Conn, which Start reads the
// server's largest payload through once its streams are made, passes the
// pause.
type slowConn struct {
	committer.JetStream
	pause *lifecycletest.Pause
}

func (s *slowConn) Conn() *nats.Conn {
	s.pause.Enter()
	return s.JetStream.Conn()
}

// TestStopDuringStartLifecycle is StartRacesStop of Stress with the Stop
// held to the moment Start has made its stream and started none of its
// parts: the race a Stress run meets only by chance. After the Stop that
// follows both, nothing of the committer runs.
func TestStopDuringStartLifecycle(t *testing.T) {
	b := stressCell(t, 5)
	for range 3 {
		js := &slowConn{JetStream: b.js, pause: lifecycletest.NewPause(50 * time.Millisecond)}
		s := b.committerOf(t, js)
		lifecycletest.StopWhileStarting(t, s, js.pause)
	}
}
