package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/store"
)

// MoveOptions bound a move.
type MoveOptions struct {
	// Settle is how long the sending cell keeps finishing work it admitted
	// before the cut-over that has not begun: past it, such work is handed
	// over and runs in the receiving cell. Work whose call is running
	// finishes where it is, however long. Default 2m.
	Settle time.Duration
	// Quiet is how long the cut is announced before the sending cell is
	// fenced, so every ingress of the region holds the tenant's requests
	// and those admitted just before have made their work. Default 500ms.
	Quiet time.Duration
	// Waiting, when set, hears what the move's tail waits for, each time
	// it changes.
	Waiting func([]store.Waiting)
}

// MoveReport is what a move did.
type MoveReport struct {
	Held    time.Duration  // how long the tenant's requests were held, at the cut
	Copied  map[string]int // rows copied to the receiving cell at the cut, per table
	Tail    int            // work items the sending cell finished after the cut, copied as each ended
	Handed  bool           // whether work not begun by Settle was handed over
	Took    time.Duration  // the whole move, the tail included
	Dropped map[string]int // rows removed from the sending cell, per table
	Resumed bool           // the move's tail was taken up where an earlier run left it
}

// Move moves tenant from cell from (its store fromDB) to cell to (toDB)
// of region, whose placement bucket is kv, while its traffic flows.
//
// The cut: the map announces it (every ingress holds the tenant's
// requests rather than refusing them), the sending cell is fenced (it
// admits no new work of the tenant), the tenant's history is copied to the
// receiving cell in one transaction — work the sending cell has not
// finished as rows held elsewhere — and the map names the receiving cell.
// The tail: the sending cell finishes what it admitted, and each item is
// copied over as it ends; what has not begun by Settle is handed over.
// Then the sending cell's copy is removed. A move whose tail was cut short
// (the command stopped) is taken up again by running it again.
func Move(ctx context.Context, kv jetstream.KeyValue, region string, fromDB, toDB *store.Store, tenant, from, to string,
	o MoveOptions) (MoveReport, error) {
	if o.Settle <= 0 {
		o.Settle = 2 * time.Minute
	}
	if o.Quiet <= 0 {
		o.Quiet = 500 * time.Millisecond
	}
	start := time.Now()
	var r MoveReport
	snap, err := Read(ctx, kv, region)
	if err != nil {
		return r, err
	}
	m, moving := snap.Moving[tenant]
	switch {
	case from == to:
		return r, fmt.Errorf("placement: %s is served by %s already", tenant, to)
	case moving && m.Phase == PhaseTail && m.From == from && m.To == to:
		r.Resumed = true
	case moving && m.Phase == PhaseTail:
		return r, fmt.Errorf("placement: %s is still moving from %s to %s: run that move again to finish it first", tenant, m.From, m.To)
	case moving && (m.From != from && m.From != "" || m.To != to):
		return r, fmt.Errorf("placement: %s is being moved from %s to %s", tenant, m.From, m.To)
	case !moving && snap.CellOf(tenant) != from:
		return r, fmt.Errorf("placement: %s is served by %s, not %s", tenant, snap.CellOf(tenant), from)
	}
	cutAt := m.At
	if !r.Resumed {
		if cutAt, err = cut(ctx, kv, fromDB, toDB, tenant, from, to, moving, o, &r); err != nil {
			return r, err
		}
		r.Held = time.Since(start)
	}
	if err := tail(ctx, fromDB, toDB, tenant, cutAt, o, &r); err != nil {
		return r, err
	}
	if r.Dropped, err = fromDB.DropTenant(ctx, tenant); err != nil {
		return r, fmt.Errorf("%w; %s is served by %s now, and %s still holds a copy of its history: run the move again", err, tenant, to, from)
	}
	if err := kv.Delete(ctx, movingPrefix+tenant); err != nil {
		return r, fmt.Errorf("placement: end the move of %s: %w", tenant, err)
	}
	r.Took = time.Since(start)
	return r, nil
}

// putMoving writes tenant's moving entry.
func putMoving(ctx context.Context, kv jetstream.KeyValue, tenant string, m Moving) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, movingPrefix+tenant, b); err != nil {
		return fmt.Errorf("placement: move %s (%s): %w", tenant, m.Phase, err)
	}
	return nil
}

// cut makes the receiving cell serve tenant, and returns when.
// again says an earlier run was stopped during the cut: a copy it
// committed stands.
func cut(ctx context.Context, kv jetstream.KeyValue, fromDB, toDB *store.Store, tenant, from, to string, again bool, o MoveOptions,
	r *MoveReport) (time.Time, error) {
	m := Moving{From: from, To: to, Phase: PhaseCut, At: time.Now().UTC()}
	if err := putMoving(ctx, kv, tenant, m); err != nil {
		return time.Time{}, err
	}
	giveUp := func(err error) (time.Time, error) {
		ctx := context.WithoutCancel(ctx)
		if uerr := fromDB.UnfenceTenant(ctx, tenant); uerr != nil {
			return time.Time{}, fmt.Errorf("%w; and %v: the tenant's requests stay held until the move is run again", err, uerr)
		}
		_ = kv.Delete(ctx, movingPrefix+tenant)
		return time.Time{}, fmt.Errorf("%w; the move was given up and %s is served by %s", err, tenant, from)
	}
	select {
	case <-ctx.Done():
		return giveUp(ctx.Err())
	case <-time.After(o.Quiet):
	}
	if err := fromDB.FenceTenant(ctx, tenant, to); err != nil {
		return giveUp(err)
	}
	var err error
	for try := 0; ; try++ {
		r.Copied, err = fromDB.CopyTenant(ctx, toDB, tenant, from)
		if errors.Is(err, store.ErrTenantBusy) && try < 5 {
			continue
		}
		if errors.Is(err, store.ErrTenantHere) && again {
			err = nil
		}
		if err != nil {
			return giveUp(err)
		}
		break
	}
	m.Phase = PhaseTail
	if err := Place(ctx, kv, tenant, to); err != nil {
		return time.Time{}, fmt.Errorf("%w; %s's history is in %s and its requests stay held: run the move again", err, tenant, to)
	}
	if err := putMoving(ctx, kv, tenant, m); err != nil {
		return time.Time{}, fmt.Errorf("%w; run the move again", err)
	}
	if err := addHop(ctx, kv, tenant, Hop{From: from, To: to, At: m.At}); err != nil {
		return time.Time{}, err
	}
	return m.At, nil
}

// tail copies the work the sending cell finishes to the receiving cell as
// it ends, handing over what has not begun once o.Settle has passed since
// the cut, until none is left.
func tail(ctx context.Context, fromDB, toDB *store.Store, tenant string, cutAt time.Time, o MoveOptions, r *MoveReport) error {
	last := ""
	for {
		handOver := time.Since(cutAt) >= o.Settle
		n, waiting, err := toDB.TailTenant(ctx, fromDB, tenant, handOver)
		r.Tail += n
		r.Handed = r.Handed || handOver && len(waiting)+n > 0
		if err != nil {
			return fmt.Errorf("placement: the tail of %s's move: %w; %s is served by the receiving cell, run the move again to finish it", tenant, err, tenant)
		}
		if o.Waiting != nil {
			if s := fmt.Sprint(waiting); s != last {
				o.Waiting(waiting)
				last = s
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("placement: the tail of %s's move: %w; run the move again to finish it", tenant, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
