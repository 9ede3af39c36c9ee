package event

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes a cluster answers while it forms, elects a
// leader or has a node away (nats-server's errors.json).
const (
	codeNoPeers       jetstream.ErrorCode = 10005 // no suitable peers for placement
	codeNotAvailable  jetstream.ErrorCode = 10008 // JetStream system temporarily unavailable
	codeNotLeader     jetstream.ErrorCode = 10009 // JetStream not the leader
	codeStreamOffline jetstream.ErrorCode = 10118 // stream is offline
)

// DefaultWait is how long Await waits when neither its context nor its
// settings bound it.
const DefaultWait = 30 * time.Second

// Unready reports whether err is an answer a JetStream cluster gives while
// it is not ready yet and will be by waiting: forming (no meta leader, too
// few peers for a replicated stream), electing a leader, a node away, a
// request the broker lost or did not answer in time, or the connection
// reconnecting. A permission, a configuration the server refuses and
// JetStream not being enabled at all are not: waiting cannot mend them.
func Unready(err error) bool {
	if err == nil {
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case codeNoPeers, codeNotAvailable, codeNotLeader, codeStreamOffline:
			return true
		case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return false
		}
		return api.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected)
}

// TryTimeout bounds one try of Await: a request a forming cluster leaves
// unanswered is asked again after it.
const TryTimeout = 3 * time.Second

// Await runs op until it succeeds, fails with an error Unready does not
// accept, or wait has passed (or ctx ends first), whichever comes first.
// The first try is always made, so a wait of 0 or less tries once. Each
// try has TryTimeout; between tries it backs off from 250ms to 5s with
// jitter and logs what it waits for (what: "stream ASSAY_WORK_US"). The
// error it gives up with names what and, after waiting, how long it
// waited.
func Await(ctx context.Context, log *slog.Logger, what string, wait time.Duration, op func(context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	start := time.Now()
	deadline := start.Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	delay := 250 * time.Millisecond
	for n := 1; ; n++ {
		tctx, cancel := context.WithTimeout(ctx, TryTimeout)
		err := op(tctx)
		cancel()
		switch {
		case err == nil:
			if n > 1 {
				log.Info("jetstream ready", "for", what, "tries", n, "waited", time.Since(start).Round(time.Millisecond).String())
			}
			return nil
		case !Unready(err):
			return fmt.Errorf("%s: %w", what, err)
		case ctx.Err() != nil && ctx.Err() != context.DeadlineExceeded:
			return fmt.Errorf("%s: %w", what, err)
		}
		// Up to a fifth less, so instances started together spread out.
		sleep := delay - time.Duration(rand.Int64N(int64(delay/5)))
		if !time.Now().Add(sleep).Before(deadline) {
			if n == 1 {
				return fmt.Errorf("%s: %w", what, err)
			}
			return fmt.Errorf("%s: JetStream not ready after %s: %w", what, time.Since(start).Round(time.Second), err)
		}
		log.Warn("waiting for jetstream", "for", what, "try", n, "err", err, "retry_in", sleep.Round(time.Millisecond).String(),
			"gives_up_in", time.Until(deadline).Round(time.Second).String())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(sleep):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// EnsureBucket creates or updates a key-value bucket with the replicas and
// placement of s (a cell's streams' settings), waiting out a cluster that
// is not ready for up to s.Wait.
func EnsureBucket(ctx context.Context, js jetstream.KeyValueManager, log *slog.Logger, cfg jetstream.KeyValueConfig, s StreamSettings) (jetstream.KeyValue, error) {
	s = s.WithDefaults()
	cfg.Replicas = s.Replicas
	if len(s.Placement) > 0 {
		cfg.Placement = &jetstream.Placement{Tags: s.Placement}
	}
	var kv jetstream.KeyValue
	err := Await(ctx, log, "bucket "+cfg.Bucket, s.Wait, func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	return kv, err
}
