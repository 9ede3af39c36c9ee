package consumer

import (
	"context"
	"log/slog"
	"time"
)

// Step is the error policy of a consumer whose work on a message is one
// step that either finishes with it or needs it again: the committer's
// commit, the publisher's publication, the ledger's append.
type Step[T any] struct {
	// Log records each error that sends a message again.
	Log *slog.Logger
	// Failed is that log line's message ("commit failed; will retry").
	Failed string
	// Attrs name the message in the log line.
	Attrs func(v T) []any
	// Wait is how long the message waits before it comes again.
	Wait time.Duration
	// Permanent says an error is one no retry mends; nil, none is. Such a
	// message is given up: GiveUp records it, and it is settled done, since
	// delivering it again could never succeed.
	Permanent func(error) bool
	GiveUp    func(ctx context.Context, v T, err error)
}

// Settle is the disposition of a message v whose step returned err: nil
// is done, a permanent error is given up, any other is logged and the
// message retried after Wait.
func (r Step[T]) Settle(ctx context.Context, v T, err error) Disposition {
	switch {
	case err == nil:
		return Done()
	case r.Permanent != nil && r.Permanent(err):
		if r.GiveUp != nil {
			r.GiveUp(ctx, v, err)
		}
		return Done()
	}
	r.Log.Warn(r.Failed, append(r.Attrs(v), "err", err)...)
	return Retry(r.Wait)
}
