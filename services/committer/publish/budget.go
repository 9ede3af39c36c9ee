package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// GitHub's limits on what one App installation may make: content-creating
// requests (POST, PATCH, PUT, DELETE) a minute and an hour. Past either it
// answers 403 with a secondary rate limit.
const (
	DefaultWritesPerMinute = 80
	DefaultWritesPerHour   = 500
)

// Budget paces the content-creating requests made for each installation,
// so a burst of publications is spread under GitHub's limits rather than
// refused. It is a sliding log per installation of the writes made in the
// last hour, with a hold GitHub imposed (a secondary limit's Retry-After,
// a primary limit's reset). With a key-value bucket every publisher that
// opens the same bucket (every committer replica of every cell of the
// region) draws from one budget per installation; while the bucket cannot
// be reached, and with none, each process keeps its own.
type Budget struct {
	// PerMinute and PerHour bound the writes of one installation in any
	// 60 s and any 3600 s. Defaults GitHub's: 80 and 500.
	PerMinute, PerHour int
	// Open makes or finds the shared bucket; nil keeps the budget in this
	// process. A failed open is tried again on a later write.
	Open func(context.Context) (jetstream.KeyValue, error)
	// Now is the budget's clock. Default time.Now.
	Now func() time.Time

	mu       sync.Mutex
	kv       jetstream.KeyValue
	openNext time.Time // no open of the bucket before this, after one failed
	local    map[int64]*ledgerOf
}

// margin is how much longer than GitHub's a window is kept: a write is
// counted here before it is sent, and GitHub counts it when it arrives, so
// a write let through the moment an earlier one left this window could
// still find that one in GitHub's.
const margin = 2 * time.Second

// ledgerOf is one installation's writes in the last hour (Unix
// milliseconds, oldest first) and the time before which none may be made.
type ledgerOf struct {
	Held   int64   `json:"held,omitempty"`
	Writes []int64 `json:"writes"`
}

// errPaced is the cause of a RetryError for a write the installation's
// budget had no room for: nothing was sent.
var errPaced = errors.New("the installation's GitHub write budget is spent for now")

func (b *Budget) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

func (b *Budget) limits() (minute, hour int) {
	minute, hour = b.PerMinute, b.PerHour
	if minute <= 0 {
		minute = DefaultWritesPerMinute
	}
	if hour <= 0 {
		hour = DefaultWritesPerHour
	}
	return minute, hour
}

// key is an installation's key in the bucket.
func key(inst int64) string { return "inst." + strconv.FormatInt(inst, 10) }

// Take reserves one write of installation inst now, or says how long
// until one fits (0: reserved).
func (b *Budget) Take(ctx context.Context, inst int64) (time.Duration, error) {
	var wait time.Duration
	err := b.change(ctx, inst, func(l *ledgerOf, now time.Time) bool {
		if wait = b.room(l, now); wait > 0 {
			return false
		}
		l.Writes = append(l.Writes, now.UnixMilli())
		return true
	})
	return wait, err
}

// Hold stops every write of installation inst until until: GitHub said so.
func (b *Budget) Hold(ctx context.Context, inst int64, until time.Time) error {
	return b.change(ctx, inst, func(l *ledgerOf, _ time.Time) bool {
		if until.UnixMilli() <= l.Held {
			return false
		}
		l.Held = until.UnixMilli()
		return true
	})
}

// room is how long until one more write fits in l at now: the hold, and
// the time until the oldest write of a full minute or hour leaves it.
func (b *Budget) room(l *ledgerOf, now time.Time) time.Duration {
	perMinute, perHour := b.limits()
	ms := now.UnixMilli()
	wait := max(l.Held-ms, 0)
	for _, w := range []struct {
		span  int64
		limit int
	}{{(time.Minute + margin).Milliseconds(), perMinute}, {(time.Hour + margin).Milliseconds(), perHour}} {
		// The writes inside the window, oldest first; one more fits when
		// fewer than limit are there once the oldest ones have left.
		from, _ := slices.BinarySearch(l.Writes, ms-w.span+1)
		in := l.Writes[from:]
		if over := len(in) - w.limit + 1; over > 0 {
			wait = max(wait, in[over-1]+w.span-ms)
		}
	}
	return time.Duration(wait) * time.Millisecond
}

// prune drops the writes that left the hour.
func prune(l *ledgerOf, now time.Time) {
	from, _ := slices.BinarySearch(l.Writes, now.UnixMilli()-(time.Hour+margin).Milliseconds()+1)
	l.Writes = l.Writes[from:]
}

// change reads installation inst's ledger, lets f change it (f says
// whether it did) and writes it back: in the bucket under the revision it
// read, tried again when another publisher wrote in between; in this
// process when there is no bucket or it cannot be reached.
func (b *Budget) change(ctx context.Context, inst int64, f func(*ledgerOf, time.Time) bool) error {
	kv := b.bucket(ctx)
	if kv == nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.changeLocal(inst, f)
	}
	for {
		var l ledgerOf
		var rev uint64
		e, err := kv.Get(ctx, key(inst))
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return b.fallBack(inst, f, err)
		default:
			if err := json.Unmarshal(e.Value(), &l); err != nil {
				// A value no release wrote: started again.
				l = ledgerOf{}
			}
			rev = e.Revision()
		}
		now := b.now()
		prune(&l, now)
		if !f(&l, now) {
			return nil
		}
		v, err := json.Marshal(l)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key(inst), v)
		} else {
			_, err = kv.Update(ctx, key(inst), v, rev)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, jetstream.ErrKeyExists):
			// Another publisher wrote first: read again.
			if ctx.Err() != nil {
				return ctx.Err()
			}
		default:
			return b.fallBack(inst, f, err)
		}
	}
}

// fallBack keeps to this process's own ledger when the bucket failed.
func (b *Budget) fallBack(inst int64, f func(*ledgerOf, time.Time) bool, cause error) error {
	if errors.Is(cause, context.Canceled) || errors.Is(cause, context.DeadlineExceeded) {
		return fmt.Errorf("github budget: %w", cause)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kv, b.openNext = nil, time.Now().Add(30*time.Second) // opened again later
	return b.changeLocal(inst, f)
}

func (b *Budget) changeLocal(inst int64, f func(*ledgerOf, time.Time) bool) error {
	if b.local == nil {
		b.local = map[int64]*ledgerOf{}
	}
	l := b.local[inst]
	if l == nil {
		l = &ledgerOf{}
		b.local[inst] = l
	}
	now := b.now()
	prune(l, now)
	f(l, now)
	return nil
}

// bucket is the shared bucket, opened on first use; nil when there is
// none or it cannot be opened now.
func (b *Budget) bucket(ctx context.Context) jetstream.KeyValue {
	if b.Open == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv == nil && !time.Now().Before(b.openNext) {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		kv, err := b.Open(octx)
		if err != nil {
			b.openNext = time.Now().Add(30 * time.Second)
			return nil
		}
		b.kv = kv
	}
	return b.kv
}
