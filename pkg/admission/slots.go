package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/event"
)

// SlotKV is what CellSlots needs of a JetStream key-value bucket.
type SlotKV interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
	WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
}

// CellSlots is a ceiling on calls at once shared by every instance of a
// cell: Size slots, each a key of a key-value bucket. A call holds one
// slot, taken with Create — which succeeds for one writer only, and only
// while the key does not exist — and given back with a Delete of the
// revision taken. However many instances run (an autoscaler's maximum and
// a rolling update's surge), they hold at most Size slots together.
//
// A slot lives as long as its holder refreshes it: the bucket's entries age
// out after TTL, and a holder writes each of its slots again every TTL/3,
// so the slots of an instance that died come free within TTL. An instance
// cut from NATS for longer than that loses its slots while its calls run
// on; Lost counts them. What each instance knows of the others' slots
// comes from a watch of the bucket, so a full cell costs no round trips
// until a slot is given back.
type CellSlots struct {
	// Open opens (or creates) the bucket. It is called until it succeeds.
	Open func(ctx context.Context) (SlotKV, error)
	// Size is the cell's ceiling. Required, at least 1.
	Size int
	// Holder names this instance in the slots it holds.
	Holder string
	// TTL is the bucket's entry lifetime, which Open must give the
	// bucket. Default 30s.
	TTL time.Duration
	// Log is told when the bucket cannot be reached, once per spell.
	Log *slog.Logger

	// op serializes this instance's writes of its own slots (a refresh
	// and a give-back of one slot would otherwise race on its revision).
	op      sync.Mutex
	mu      sync.Mutex
	kv      SlotKV
	watcher jetstream.KeyWatcher
	taken   map[string]bool   // slots the watch says someone holds
	freed   map[string]uint64 // slots the watch saw given back, at the revision of the deletion
	held    map[string]uint64 // this instance's slots, by key, at their revision
	changed chan struct{}     // closed and replaced when a slot may have come free
	stop    context.CancelFunc
	done    chan struct{}
	failing bool

	lost atomic.Int64
}

// SlotTTL is CellSlots' default TTL.
const SlotTTL = 30 * time.Second

func (c *CellSlots) ttl() time.Duration { return cmp.Or(c.TTL, SlotTTL) }

func slotKey(i int) string { return "slot." + strconv.Itoa(i) }

// Take waits for a slot of the cell and returns what gives it back (only
// its first call has an effect). It waits as long as ctx allows, through a
// full cell and through a bucket that does not answer; its error is ctx's.
func (c *CellSlots) Take(ctx context.Context) (release func(), err error) {
	if c.Size < 1 {
		return nil, fmt.Errorf("admission: CellSlots.Size must be at least 1, got %d", c.Size)
	}
	backoff := 50 * time.Millisecond
	for {
		kv, changed, err := c.ready(ctx)
		if err == nil {
			var key string
			if key, err = c.tryTake(ctx, kv); err == nil && key != "" {
				c.note(nil)
				return c.releaser(kv, key), nil
			}
			if err == nil {
				backoff = 50 * time.Millisecond
				// Full: wait for the watch to see a slot given back, or
				// look again after a while in case it missed one.
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-changed:
				case <-time.After(c.ttl() / 4):
				}
				continue
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c.note(err)
		// The bucket may be gone (a broker that lost its store, or a
		// memory bucket on a server that restarted): open it again, as a
		// stream's owner makes its stream again.
		c.reopen(kv)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(rand.N(backoff) + backoff/2):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// tryTake creates the first free slot, starting at a random one so that
// instances seldom race for the same key; key is "" when every slot is
// taken.
func (c *CellSlots) tryTake(ctx context.Context, kv SlotKV) (key string, err error) {
	start := rand.N(c.Size)
	for n := range c.Size {
		k := slotKey((start + n) % c.Size)
		c.mu.Lock()
		busy := c.taken[k] || c.held[k] != 0
		c.mu.Unlock()
		if busy {
			continue
		}
		// A slot given back is taken with one write on the deletion's
		// revision (only one writer can follow it); one never written, or
		// whose deletion the watch did not see, with a create.
		c.mu.Lock()
		after, seen := c.freed[k]
		c.mu.Unlock()
		var rev uint64
		var err error
		if seen {
			rev, err = kv.Update(ctx, k, []byte(c.Holder), after)
		} else {
			rev, err = kv.Create(ctx, k, []byte(c.Holder))
		}
		switch {
		case err == nil:
			c.mu.Lock()
			c.held[k], c.taken[k] = rev, true
			delete(c.freed, k)
			c.mu.Unlock()
			return k, nil
		case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			c.mu.Lock()
			c.taken[k] = true
			delete(c.freed, k)
			c.mu.Unlock()
		default:
			return "", err
		}
	}
	return "", nil
}

func (c *CellSlots) releaser(kv SlotKV, key string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.op.Lock()
			defer c.op.Unlock()
			c.mu.Lock()
			cur, mine := c.held[key]
			delete(c.held, key)
			c.mu.Unlock()
			if !mine {
				return // lapsed: another instance may hold it now
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Only the revision this instance wrote last: a slot that lapsed
			// and was taken again is the new holder's.
			err := kv.Delete(ctx, key, jetstream.LastRevision(cur))
			if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				c.note(fmt.Errorf("give back %s: %w", key, err))
			}
		})
	}
}

// ready opens the bucket and starts the watch and the refresh once.
func (c *CellSlots) ready(ctx context.Context) (SlotKV, <-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv != nil {
		return c.kv, c.changed, nil
	}
	kv, err := c.Open(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("the cell's slots bucket: %w", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watch the cell's slots: %w", err)
	}
	c.kv, c.watcher, c.stop, c.done = kv, w, cancel, make(chan struct{})
	c.taken, c.freed, c.changed = map[string]bool{}, map[string]uint64{}, make(chan struct{})
	if c.held == nil {
		c.held = map[string]uint64{}
	}
	go c.run(wctx, kv, w)
	return c.kv, c.changed, nil
}

// reopen forgets the bucket kv and its watch, so the next take opens it
// again; the slots held in it are refreshed there, or counted lost.
func (c *CellSlots) reopen(kv SlotKV) {
	c.mu.Lock()
	if kv == nil || c.kv != kv {
		c.mu.Unlock()
		return
	}
	stop, done := c.stop, c.done
	c.kv, c.watcher, c.stop = nil, nil, nil
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// run follows the watch and refreshes this instance's slots until Stop,
// or until the watch ends (the bucket went away), when the next take opens
// the bucket again.
func (c *CellSlots) run(ctx context.Context, kv SlotKV, w jetstream.KeyWatcher) {
	defer close(c.done)
	defer func() { _ = w.Stop() }()
	defer func() {
		c.mu.Lock()
		var stop context.CancelFunc
		if c.kv == kv && ctx.Err() == nil {
			stop = c.stop
			c.kv, c.watcher, c.stop = nil, nil, nil
		}
		c.mu.Unlock()
		if stop != nil {
			stop()
		}
	}()
	refresh := time.NewTicker(c.ttl() / 3)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue // the initial values are all in
			}
			c.mu.Lock()
			if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
				delete(c.taken, e.Key())
				c.freed[e.Key()] = e.Revision()
				close(c.changed)
				c.changed = make(chan struct{})
			} else {
				c.taken[e.Key()] = true
				delete(c.freed, e.Key())
			}
			c.mu.Unlock()
		case <-refresh.C:
			c.refresh(ctx, kv)
		}
	}
}

// refresh writes each held slot again before it ages out; one that
// changed meanwhile lapsed and is counted lost.
func (c *CellSlots) refresh(ctx context.Context, kv SlotKV) {
	c.mu.Lock()
	keys := make([]string, 0, len(c.held))
	for k := range c.held {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	for _, k := range keys {
		c.refreshOne(ctx, kv, k)
	}
}

func (c *CellSlots) refreshOne(ctx context.Context, kv SlotKV, k string) {
	c.op.Lock()
	defer c.op.Unlock()
	c.mu.Lock()
	r, still := c.held[k]
	c.mu.Unlock()
	if !still {
		return // given back meanwhile
	}
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rev, err := kv.Update(uctx, k, []byte(c.Holder), r)
	cancel()
	switch {
	case err == nil:
		c.mu.Lock()
		c.held[k] = rev
		c.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) ||
		errors.Is(err, jetstream.ErrKeyExists):
		c.mu.Lock()
		delete(c.held, k)
		c.mu.Unlock()
		c.lost.Add(1)
		if c.Log != nil {
			c.Log.Warn("a model-call slot of the cell lapsed while held; its call runs on above the cell's ceiling", "slot", k)
		}
	case ctx.Err() == nil:
		c.note(fmt.Errorf("refresh %s: %w", k, err))
	}
}

// note logs the first error of a spell and the recovery after it.
func (c *CellSlots) note(err error) {
	c.mu.Lock()
	was := c.failing
	c.failing = err != nil
	c.mu.Unlock()
	if c.Log == nil || was == (err != nil) {
		return
	}
	if err != nil {
		c.Log.Warn("the cell's model-call slots do not answer; calls wait for them", "err", err)
	} else {
		c.Log.Info("the cell's model-call slots answer again")
	}
}

// Held is how many slots this instance holds now.
func (c *CellSlots) Held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// Lost counts the slots that lapsed while this instance held them.
func (c *CellSlots) Lost() int64 { return c.lost.Load() }

// Stop ends the watch and the refresh; slots still held lapse within TTL.
// It tolerates a CellSlots never used and a second call.
func (c *CellSlots) Stop() {
	c.mu.Lock()
	stop, done := c.stop, c.done
	c.stop = nil
	c.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// OpenSlots is a CellSlots.Open that creates or updates the cell's slots
// bucket: entries that age out after ttl with a marker a watch sees, in
// memory, at the replicas and placement of the cell's streams (streams),
// so the slots outlive a server's restart as the streams do.
func OpenSlots(js jetstream.KeyValueManager, bucket string, ttl time.Duration, streams event.StreamSettings) func(context.Context) (SlotKV, error) {
	return func(ctx context.Context) (SlotKV, error) {
		return event.EnsureBucket(ctx, js, nil, jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: ttl, LimitMarkerTTL: ttl,
			Description: "the cell's model-call slots, one per call in flight, shared by its classifier instances",
			Storage:     jetstream.MemoryStorage}, streams.Once())
	}
}
