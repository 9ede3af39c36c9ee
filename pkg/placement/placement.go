// Package placement is a region's map of which cell serves each tenant,
// and where each cell answers. It lives in one NATS key-value bucket per
// region (event.Names.PlacementBucket), read by every ingress of the
// region through a watch and written by "assay tenant place" and by each
// ingress registering its own address. A tenant the map does not name is
// served by the cell named after its region, so a region of one cell needs
// no entry at all.
package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
)

// Key prefixes of the bucket: tenant.<id> holds the tenant's cell id,
// cell.<id> the cell's Cell.
const (
	tenantPrefix = "tenant."
	cellPrefix   = "cell."
	movingPrefix = "moving."
	hopsPrefix   = "hops."
)

// Phases of a move, as the map's moving.<tenant> entry names them.
const (
	// PhaseCut: the tenant's history is being copied to the receiving
	// cell. Requests are held by every ingress (not refused) for the
	// moment it takes, and the sending cell admits no new work.
	PhaseCut = "cut"
	// PhaseTail: the receiving cell serves the tenant; work the sending
	// cell admitted before the cut finishes there and is copied over as it
	// ends. The sending cell answers what the receiving one sends it for
	// that work.
	PhaseTail = "tail"
)

// Moving is a tenant's move between two cells of the region.
type Moving struct {
	From  string    `json:"from"`
	To    string    `json:"to"`
	Phase string    `json:"phase"`
	At    time.Time `json:"at"`
}

// Hop is one finished cut-over of a tenant from one cell to another: events
// of the tenant before At are in From's streams, after it in To's.
type Hop struct {
	From string    `json:"from"`
	To   string    `json:"to"`
	At   time.Time `json:"at"`
}

// Cell is one cell of the region as it registered itself.
type Cell struct {
	ID string `json:"id"`
	// URL is where the cell's ingress answers the other cells of the
	// region: what they forward its tenants' requests to.
	URL string    `json:"url"`
	At  time.Time `json:"at"`
}

// Bucket makes (or finds) a region's placement bucket, with replicas and
// placed on servers with tags, as the region's streams are. A cluster that
// is not ready (forming, electing a leader) is waited out for up to
// event.DefaultWait, or until ctx ends.
func Bucket(ctx context.Context, js jetstream.KeyValueManager, bucket string, replicas int, tags ...string) (jetstream.KeyValue, error) {
	return bucketWaiting(ctx, js, nil, bucket, event.StreamSettings{Replicas: max(replicas, 1), Placement: tags})
}

func bucketWaiting(ctx context.Context, js jetstream.KeyValueManager, log *slog.Logger, bucket string, s event.StreamSettings) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: bucket, History: 1,
		Description: "which cell of the region serves each tenant, and where each cell answers"}
	kv, err := event.EnsureBucket(ctx, js, log, cfg, s)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return kv, nil
}

// Snapshot is the map as read at one time.
type Snapshot struct {
	Region string
	// Tenants maps a tenant to its cell; a tenant not in it is served by
	// the cell named after the region.
	Tenants map[string]string
	Cells   map[string]Cell
	// Moving maps a tenant being moved to its move.
	Moving map[string]Moving
}

// ErrMoving is the error of a tenant whose history is being copied to
// another cell (PhaseCut): for that moment no cell admits its work.
type ErrMoving struct{ Tenant, To string }

func (e *ErrMoving) Error() string {
	return fmt.Sprintf("tenant %s is moving to cell %s; try again in a few seconds", e.Tenant, e.To)
}

// Serving is the cell that serves tenant, or *ErrMoving while its history
// is copied to another cell. In a move's tail the receiving cell serves
// it.
func (s *Snapshot) Serving(tenant string) (string, error) {
	if m, ok := s.Moving[tenant]; ok && m.Phase != PhaseTail {
		return "", &ErrMoving{Tenant: tenant, To: m.To}
	}
	return s.CellOf(tenant), nil
}

// Finishing reports whether cell finishes work of tenant that it admitted
// before a move to asker: what asker sends it for that work, it answers.
func (s *Snapshot) Finishing(tenant, cell, asker string) bool {
	m, ok := s.Moving[tenant]
	return ok && m.Phase == PhaseTail && m.From == cell && m.To == asker
}

// CellOf is the cell that serves tenant.
func (s *Snapshot) CellOf(tenant string) string {
	if c, ok := s.Tenants[tenant]; ok {
		return c
	}
	return s.Region
}

// Choose is the default placement of a new tenant: the registered cell
// serving the fewest tenants (the lowest id among equals), or the region's
// own cell when none has registered.
func (s *Snapshot) Choose() string {
	if len(s.Cells) == 0 {
		return s.Region
	}
	load := map[string]int{}
	for _, c := range s.Tenants {
		load[c]++
	}
	ids := make([]string, 0, len(s.Cells))
	for id := range s.Cells {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	best := ids[0]
	for _, id := range ids[1:] {
		if load[id] < load[best] {
			best = id
		}
	}
	return best
}

func (s *Snapshot) apply(e jetstream.KeyValueEntry) error {
	key, put := e.Key(), e.Operation() == jetstream.KeyValuePut
	switch {
	case strings.HasPrefix(key, tenantPrefix):
		t := strings.TrimPrefix(key, tenantPrefix)
		if !put {
			delete(s.Tenants, t)
			return nil
		}
		s.Tenants[t] = string(e.Value())
	case strings.HasPrefix(key, movingPrefix):
		t := strings.TrimPrefix(key, movingPrefix)
		if !put {
			delete(s.Moving, t)
			return nil
		}
		s.Moving[t] = parseMoving(e.Value())
	case strings.HasPrefix(key, cellPrefix):
		id := strings.TrimPrefix(key, cellPrefix)
		if !put {
			delete(s.Cells, id)
			return nil
		}
		var c Cell
		if err := json.Unmarshal(e.Value(), &c); err != nil {
			return fmt.Errorf("placement: %s: %w", key, err)
		}
		s.Cells[id] = c
	}
	return nil
}

// parseMoving reads a moving.<tenant> value: JSON, or the bare cell id an
// earlier version wrote, which held the tenant while it moved.
func parseMoving(v []byte) Moving {
	var m Moving
	if json.Unmarshal(v, &m) == nil && m.To != "" {
		return m
	}
	return Moving{To: string(v), Phase: PhaseCut}
}

func newSnapshot(region string) *Snapshot {
	return &Snapshot{Region: region, Tenants: map[string]string{}, Cells: map[string]Cell{}, Moving: map[string]Moving{}}
}

// History is tenant's cut-overs, oldest first: where its events were made
// when.
func History(ctx context.Context, kv jetstream.KeyValue, tenant string) ([]Hop, error) {
	e, err := kv.Get(ctx, hopsPrefix+tenant)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("placement: history of %s: %w", tenant, err)
	}
	var hops []Hop
	if err := json.Unmarshal(e.Value(), &hops); err != nil {
		return nil, fmt.Errorf("placement: history of %s: %w", tenant, err)
	}
	return hops, nil
}

// addHop appends a cut-over to tenant's history.
func addHop(ctx context.Context, kv jetstream.KeyValue, tenant string, h Hop) error {
	hops, err := History(ctx, kv, tenant)
	if err != nil {
		return err
	}
	b, err := json.Marshal(append(hops, h))
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, hopsPrefix+tenant, b); err != nil {
		return fmt.Errorf("placement: history of %s: %w", tenant, err)
	}
	return nil
}

// Read reads the whole map once.
func Read(ctx context.Context, kv jetstream.KeyValue, region string) (*Snapshot, error) {
	s := newSnapshot(region)
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("placement: read: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return s, nil
			}
			if err := s.apply(e); err != nil {
				return nil, err
			}
		}
	}
}

// Place puts tenant on cell. The cell need not have registered yet: a
// cell is placed before it first starts.
func Place(ctx context.Context, kv jetstream.KeyValue, tenant, cell string) error {
	if !event.ValidToken(tenant) || !event.ValidToken(cell) {
		return fmt.Errorf("placement: %q on %q: a tenant and a cell are ids (lower-case letters, digits, hyphens)", tenant, cell)
	}
	if _, err := kv.PutString(ctx, tenantPrefix+tenant, cell); err != nil {
		return fmt.Errorf("placement: place %s on %s: %w", tenant, cell, err)
	}
	return nil
}

// Register records where cell answers.
func Register(ctx context.Context, kv jetstream.KeyValue, cell, url string) error {
	b, err := json.Marshal(Cell{ID: cell, URL: url, At: time.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, cellPrefix+cell, b); err != nil {
		return fmt.Errorf("placement: register %s: %w", cell, err)
	}
	return nil
}

// View is the map as an ingress reads it: watched, so each request looks
// it up in memory. A lifecycle part: Start returns once the values present
// at the start are in, so no request is routed on a map half read.
type View struct {
	JS       jetstream.KeyValueManager
	Bucket   string
	Region   string
	Replicas int
	Tags     []string // the servers the bucket is placed on
	// Cell and URL, when URL is set, are registered at the start: where
	// this cell answers the region's other cells.
	Cell, URL string
	// NATSURL, when set, is the connection to the region's account, where
	// the map is kept apart from every cell's account (with the cell's
	// placement user and password); JS is then not used.
	NATSURL string
	Log     *slog.Logger
	// Wait is how long Start waits out a cluster that is not ready.
	// Default event.DefaultWait.
	Wait time.Duration

	run   lifecycle.Runner
	nc    *nats.Conn
	kv    jetstream.KeyValue
	mu    sync.RWMutex
	snap  *Snapshot
	ready chan struct{}
	once  sync.Once
}

// ErrNotRead is returned while the map has not been read.
var ErrNotRead = errors.New("the region's placement of tenants is not read yet; try again")

// Start makes the bucket, registers this cell, and watches the map until
// Stop; it waits (as long as ctx allows) for the map's first reading.
func (v *View) Start(ctx context.Context) error {
	v.ready = make(chan struct{})
	if v.NATSURL != "" {
		nc, js, err := Connect(v.NATSURL, "assay-placement-"+v.Cell)
		if err != nil {
			return err
		}
		v.nc, v.JS = nc, js
	}
	s := event.StreamSettings{Replicas: max(v.Replicas, 1), Placement: v.Tags, Wait: v.Wait}
	kv, err := bucketWaiting(ctx, v.JS, v.Log, v.Bucket, s)
	if err != nil {
		v.close()
		return err
	}
	v.kv = kv
	if v.URL != "" {
		err := event.Await(ctx, v.Log, "placement: register cell "+v.Cell, s.WithDefaults().Wait, func(ctx context.Context) error {
			return Register(ctx, kv, v.Cell, v.URL)
		})
		if err != nil {
			v.close()
			return err
		}
	}
	if err := v.run.Go(ctx, func(ctx context.Context) { v.loop(ctx, kv) }); err != nil {
		v.close()
		return err
	}
	select {
	case <-v.ready:
		return nil
	case <-ctx.Done():
		v.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("placement: %w", ctx.Err())
	}
}

// Connect connects to the region's account at url, where the placement map
// is kept.
func Connect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("ASSAY_PLACEMENT_NATS_URL: connect %s: %w", config.Redacted(url), config.RedactError(err, url))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("ASSAY_PLACEMENT_NATS_URL: %w", err)
	}
	return nc, js, nil
}

// close closes the view's own connection, if it made one.
func (v *View) close() {
	if v.nc != nil {
		v.nc.Close()
		v.nc = nil
	}
}

// Register records url as where this cell answers, once the view has
// started: for a cell that learns its address only once it listens.
func (v *View) Register(ctx context.Context, url string) error {
	if v.kv == nil {
		return errors.New("placement: the view has not started")
	}
	return Register(ctx, v.kv, v.Cell, url)
}

// Stop ends the watch, and closes the view's own connection.
func (v *View) Stop(ctx context.Context) {
	v.run.Stop(ctx)
	v.close()
}

func (v *View) loop(ctx context.Context, kv jetstream.KeyValue) {
	for ctx.Err() == nil {
		if err := v.watch(ctx, kv); err != nil && ctx.Err() == nil {
			v.Log.Warn("placement map watch ended; watching again, the last map reading stands meanwhile", "bucket", v.Bucket, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (v *View) watch(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	next := newSnapshot(v.Region)
	loaded := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e == nil {
				loaded = true
				v.publish(next)
				continue
			}
			if err := next.apply(e); err != nil {
				v.Log.Warn("placement entry not read", "key", e.Key(), "err", err)
				continue
			}
			if loaded {
				v.publish(next)
			}
		}
	}
}

// publish makes a copy of s the map requests read.
func (v *View) publish(s *Snapshot) {
	c := &Snapshot{Region: s.Region, Tenants: make(map[string]string, len(s.Tenants)), Cells: make(map[string]Cell, len(s.Cells)),
		Moving: make(map[string]Moving, len(s.Moving))}
	for k, x := range s.Moving {
		c.Moving[k] = x
	}
	for k, x := range s.Tenants {
		c.Tenants[k] = x
	}
	for k, x := range s.Cells {
		c.Cells[k] = x
	}
	v.mu.Lock()
	v.snap = c
	v.mu.Unlock()
	v.once.Do(func() { close(v.ready) })
}

// Now is the map as last read; ErrNotRead before the first reading.
func (v *View) Now() (*Snapshot, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.snap == nil {
		return nil, ErrNotRead
	}
	return v.snap, nil
}
