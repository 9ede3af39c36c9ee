package placement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/store"
)

// MoveOptions bound a move.
type MoveOptions struct {
	// Settle bounds the wait for the sending cell to finish what it does
	// for the tenant (work in flight, events, the ledger, publications);
	// past it the move is given up and the tenant served where it was.
	// Default 2m.
	Settle time.Duration
	// Quiet is how long the tenant stays settled before it is copied, so
	// a request admitted just before its ingress heard of the move has
	// made its work. Default 2s.
	Quiet time.Duration
	// Progress, when set, hears what the move waits for.
	Progress func(store.Unsettled)
}

// MoveReport is what a move did.
type MoveReport struct {
	Held    time.Duration  // how long the tenant's requests were held
	Copied  map[string]int // rows copied to the receiving cell, per table
	Dropped map[string]int // rows removed from the sending cell, per table
}

// Move moves tenant from cell from (its store fromDB) to cell to (toDB)
// of region, whose placement bucket is kv. The tenant's requests are
// held (503, try again) from the start: work in flight finishes in the
// sending cell, which then holds nothing unsettled for the tenant; its
// history is copied to the receiving cell in one transaction, the
// placement map then names the receiving cell, and the sending cell's copy
// is removed. A duplicate of earlier work asked for after the move finds
// that work in the receiving cell. Given up (settling took too long), the
// tenant is served where it was and nothing was copied.
func Move(ctx context.Context, kv jetstream.KeyValue, region string, fromDB, toDB *store.Store, tenant, from, to string,
	o MoveOptions) (MoveReport, error) {
	if o.Settle <= 0 {
		o.Settle = 2 * time.Minute
	}
	if o.Quiet <= 0 {
		o.Quiet = 2 * time.Second
	}
	var r MoveReport
	snap, err := Read(ctx, kv, region)
	if err != nil {
		return r, err
	}
	switch served, err := snap.Serving(tenant); {
	case err != nil:
		return r, fmt.Errorf("placement: %w", err)
	case from == to:
		return r, fmt.Errorf("placement: %s is served by %s already", tenant, to)
	case served != from:
		return r, fmt.Errorf("placement: %s is served by %s, not %s", tenant, served, from)
	}
	start := time.Now()
	if _, err := kv.PutString(ctx, movingPrefix+tenant, to); err != nil {
		return r, fmt.Errorf("placement: hold %s: %w", tenant, err)
	}
	release := func() { _ = kv.Delete(context.WithoutCancel(ctx), movingPrefix+tenant) }
	deadline := start.Add(o.Settle)
	for {
		if err := settle(ctx, fromDB, tenant, deadline, o); err != nil {
			release()
			return r, err
		}
		r.Copied, err = fromDB.CopyTenant(ctx, toDB, tenant)
		if errors.Is(err, store.ErrTenantBusy) && time.Now().Before(deadline) {
			continue
		}
		if err != nil {
			release()
			return r, err
		}
		break
	}
	if err := Place(ctx, kv, tenant, to); err != nil {
		// The receiving cell has the history and the map does not say so:
		// the hold stays, and placing the tenant again ends the move.
		return r, fmt.Errorf("%w; the tenant's requests stay held: run assay tenant place %s --cell %s", err, tenant, to)
	}
	if err := kv.Delete(ctx, movingPrefix+tenant); err != nil {
		return r, fmt.Errorf("placement: release %s: %w", tenant, err)
	}
	r.Held = time.Since(start)
	if r.Dropped, err = fromDB.DropTenant(ctx, tenant); err != nil {
		return r, fmt.Errorf("%w; %s is served by %s now, and %s still holds a copy of its history", err, tenant, to, from)
	}
	return r, nil
}

// settle waits until the sending cell has nothing unsettled for tenant,
// and has stayed so for o.Quiet.
func settle(ctx context.Context, db *store.Store, tenant string, deadline time.Time, o MoveOptions) error {
	var quietSince time.Time
	for {
		u, err := db.TenantUnsettled(ctx, tenant)
		if err != nil {
			return err
		}
		if o.Progress != nil {
			o.Progress(u)
		}
		switch {
		case !u.Zero():
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= o.Quiet:
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("placement: %s did not settle in time (%s); it is served where it was", tenant, u)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
