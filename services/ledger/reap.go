package ledger

import (
	"context"
	"log/slog"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// reapBatch bounds the rows one reaper pass handles per query.
const reapBatch = 500

// The reaper makes the ledger whole from Postgres when the broker did not
// deliver: it re-reads ATTEMPT events the broker acknowledged and then lost
// from the outbox that published them, records attempts whose worker died
// before reporting (estimated, charged their reservation) and returns
// reservations whose attempt was never recorded. It is a lifecycle.Ticker
// on Reap; several ledger instances may reap at once, every write is
// idempotent.

// Reaped counts what one pass did.
type Reaped struct {
	Events       int   // ATTEMPT events read back from the outbox
	Dead         int   // attempts recorded as estimates
	Reservations int64 // orphan reservations released
}

// Reap runs one reaper pass.
func (s *Service) Reap(ctx context.Context) (Reaped, error) {
	var n Reaped
	payloads, err := s.d.Store.UnrecordedEvents(ctx, event.KindAttempt, s.cfg.ReapGrace, s.cfg.ReapHorizon, reapBatch)
	if err != nil {
		return n, err
	}
	for _, p := range payloads {
		var ev event.Attempt
		if err := event.Decode(p, &ev); err != nil {
			s.d.Log.Warn("undecodable ATTEMPT event in the outbox", "err", err)
			continue
		}
		telemetry.Decision(ctx, s.d.Log, ev.AttemptID, "reaped", "ATTEMPT event published but never recorded; read back from the outbox",
			slog.String("tenant", ev.TenantID), slog.String("work", ev.WorkID))
		if err := s.Append(ctx, ev); store.Permanent(err) {
			s.refuse(ctx, ev, err)
			continue
		} else if err != nil {
			return n, err
		}
		n.Events++
	}
	dead, err := s.d.Store.DeadAttempts(ctx, s.cfg.ReapGrace, reapBatch)
	if err != nil {
		return n, err
	}
	for _, d := range dead {
		// The worker claimed the work, and a claim is followed at once by
		// the model call, which the provider bills whether or not the
		// answer came back. Units are unknown; the reservation bounds them.
		if err := s.append(ctx, store.LedgerRow{AttemptID: d.AttemptID, TenantID: d.TenantID, WorkID: d.WorkID,
			Model: d.Model, Outcome: outcome.AttemptLeaseExpired, UpstreamAttempts: 1, CostMicros: d.ChargeMicros,
			OccurredAt: d.StartedAt, Estimated: true}); err != nil {
			return n, err
		}
		n.Dead++
	}
	// A reservation outlives its attempt's claim only when the worker died
	// in between; give the claim far longer than it ever takes.
	if n.Reservations, err = s.d.Store.ReleaseOrphanReservations(ctx, 4*s.cfg.ReapGrace); err != nil {
		return n, err
	}
	if n.Reservations > 0 {
		telemetry.Decision(ctx, s.d.Log, "reservations", "released",
			"reservations whose attempt was never recorded", slog.Int64("count", n.Reservations))
	}
	return n, nil
}
