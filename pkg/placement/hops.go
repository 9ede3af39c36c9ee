package placement

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// RecordHop appends a finished cut-over to tenant's history, as a move
// does: for a tool (or a test) that writes the history itself.
func RecordHop(ctx context.Context, kv jetstream.KeyValue, tenant string, h Hop) error {
	return addHop(ctx, kv, tenant, h)
}

// Histories is every tenant's cut-overs, oldest first each: where the
// events of every tenant that moved were made when. A tenant that never
// moved is not in it.
func Histories(ctx context.Context, kv jetstream.KeyValue) (map[string][]Hop, error) {
	out := map[string][]Hop{}
	l, err := kv.ListKeysFiltered(ctx, hopsPrefix+"*")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("placement: histories: %w", err)
	}
	var tenants []string
	for k := range l.Keys() {
		tenants = append(tenants, strings.TrimPrefix(k, hopsPrefix))
	}
	_ = l.Stop()
	for _, t := range tenants {
		hops, err := History(ctx, kv, t)
		if err != nil {
			return nil, err
		}
		if len(hops) > 0 {
			out[t] = hops
		}
	}
	return out, nil
}
