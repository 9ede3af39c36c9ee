package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/api"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
)

// selection is which retained messages a replay reads.
type selection struct {
	kinds          []string // stream kinds, in event.Kinds order
	tenant, lane   string
	since, until   time.Time
	fromSeq, toSeq uint64
	works          map[string]bool // payload work ids; empty selects all
}

// ReplayMsg is one retained message as assay replay dump prints it.
type ReplayMsg struct {
	Stream   string              `json:"stream"`
	Subject  string              `json:"subject"`
	Sequence uint64              `json:"sequence"`
	Time     time.Time           `json:"time"`
	Headers  map[string][]string `json:"headers,omitempty"`
	// Payload is the message's JSON; Raw its bytes when they are not JSON.
	Payload json.RawMessage `json:"payload,omitempty"`
	Raw     []byte          `json:"raw,omitempty"`
	// DecodeError says why the payload is not a valid event of its
	// stream, as the cell's consumers would refuse it.
	DecodeError string `json:"decodeError,omitempty"`
	WorkID      string `json:"workId,omitempty"`
	AttemptID   string `json:"attemptId,omitempty"`
	Outcome     string `json:"outcome,omitempty"`
	// Cell is the cell whose streams it was read from, named when the
	// tenant selected moved between cells (its history spans theirs).
	Cell string `json:"cell,omitempty"`
}

// maskLease replaces a RESULT's lease token in its payload by a digest of
// it: the token fences a commit, and a replay's output travels further
// than the stream; the digest still matches the attempt's row.
func maskLease(payload json.RawMessage, token string) json.RawMessage {
	if token == "" || payload == nil {
		return payload
	}
	sum := sha256.Sum256([]byte(token))
	return bytes.ReplaceAll(payload, []byte(`"`+token+`"`), []byte(`"masked:sha256:`+hex.EncodeToString(sum[:4])+`"`))
}

// parseWhen reads a time (RFC 3339, or a date) or a duration back from now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither a time (2006-01-02T15:04:05Z, 2006-01-02) nor a duration back from now (90m, 24h)", s)
}

// selectFlags are the flags every replay mode shares.
type selectFlags struct {
	streams, tenant, lane, since, until, seq, works string
}

// selection checks the flags. defKinds are the streams read when --stream
// names none.
func (f selectFlags) selection(now time.Time, defKinds []string) (selection, error) {
	sel := selection{tenant: f.tenant, lane: f.lane, works: map[string]bool{}}
	if f.streams == "" {
		sel.kinds = defKinds
		if f.lane != "" {
			sel.kinds = []string{event.KindWork}
		}
	} else {
		for _, s := range strings.Split(f.streams, ",") {
			k := strings.ToUpper(strings.TrimSpace(s))
			if !slices.Contains(event.Kinds, k) {
				return sel, fmt.Errorf("--stream: %q is not one of %s", s, strings.Join(event.Kinds, ", "))
			}
			if !slices.Contains(sel.kinds, k) {
				sel.kinds = append(sel.kinds, k)
			}
		}
	}
	if f.tenant != "" && !event.ValidToken(f.tenant) {
		return sel, fmt.Errorf("--tenant: %q is not a tenant id", f.tenant)
	}
	if f.lane != "" {
		if !event.ValidLane(f.lane) {
			return sel, fmt.Errorf("--lane: %q is not a lane (%s)", f.lane, strings.Join(event.Lanes, ", "))
		}
		if len(sel.kinds) != 1 || sel.kinds[0] != event.KindWork {
			return sel, fmt.Errorf("--lane selects WORK messages only: RESULT and ATTEMPT subjects carry no lane")
		}
	}
	var err error
	if sel.since, err = parseWhen(f.since, now); err != nil {
		return sel, fmt.Errorf("--since: %w", err)
	}
	if sel.until, err = parseWhen(f.until, now); err != nil {
		return sel, fmt.Errorf("--until: %w", err)
	}
	if !sel.since.IsZero() && !sel.until.IsZero() && !sel.since.Before(sel.until) {
		return sel, fmt.Errorf("--since %s is not before --until %s", sel.since.Format(time.RFC3339), sel.until.Format(time.RFC3339))
	}
	if f.seq != "" {
		lo, hi, ok := strings.Cut(f.seq, "-")
		from, err1 := strconv.ParseUint(lo, 10, 64)
		to, err2 := uint64(0), error(nil)
		if ok && hi != "" {
			to, err2 = strconv.ParseUint(hi, 10, 64)
		}
		if err1 != nil || err2 != nil || from == 0 || (to != 0 && to < from) {
			return sel, fmt.Errorf("--seq: %q is not a sequence range FROM-TO, FROM- or FROM (from 1)", f.seq)
		}
		if !ok {
			to = from
		}
		if !sel.since.IsZero() {
			return sel, fmt.Errorf("--seq and --since both say where to start; give one")
		}
		if len(sel.kinds) != 1 {
			return sel, fmt.Errorf("--seq needs one --stream: sequences are per stream")
		}
		sel.fromSeq, sel.toSeq = from, to
	}
	for _, w := range strings.Split(f.works, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		if !api.ValidWorkID(w) {
			return sel, fmt.Errorf("--work: %q is not a work id (w_ and 24 hex digits, as the API answers)", w)
		}
		sel.works[w] = true
	}
	return sel, nil
}

// unseen is the error of --work ids the read found no message of: a
// selection that names work must find it, not report 0 selected.
func (sel selection) unseen(seen map[string]bool) error {
	var missing []string
	for w := range sel.works {
		if !seen[w] {
			missing = append(missing, w)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("--work %s: no message of it in the selection (check the id, the cell and the window)", strings.Join(missing, ","))
}

// filters are the subject filters of one stream kind for the selection.
func (sel selection) filters(n event.Names, kind string) []string {
	if kind != event.KindWork {
		if sel.tenant != "" {
			return []string{n.Prefix(kind) + sel.tenant}
		}
		return []string{n.Subjects(kind)}
	}
	switch {
	case sel.lane != "" && sel.tenant != "":
		return []string{n.Work(sel.lane, sel.tenant)}
	case sel.lane != "":
		return []string{n.Lane(sel.lane)}
	case sel.tenant != "":
		// Every lane's announcements and the tenant's cancels.
		return []string{n.Prefix(kind) + "*." + sel.tenant}
	}
	return []string{n.Subjects(kind)}
}

// decodeMsg reads a retained message as its stream's event.
func decodeMsg(n event.Names, kind string, m jetstream.Msg, meta *jetstream.MsgMetadata) ReplayMsg {
	r := ReplayMsg{Stream: meta.Stream, Subject: m.Subject(), Sequence: meta.Sequence.Stream, Time: meta.Timestamp.UTC()}
	if h := m.Headers(); len(h) > 0 {
		r.Headers = map[string][]string(h)
	}
	data := m.Data()
	if json.Valid(data) {
		r.Payload = json.RawMessage(data)
	} else {
		r.Raw = data
	}
	var err error
	switch {
	case kind == event.KindWork && strings.HasPrefix(m.Subject(), n.Prefix(kind)+"cancel."):
		var c event.Cancel
		c, err = event.Parse[event.Cancel](data)
		r.WorkID = c.WorkID
	case kind == event.KindWork:
		var w event.Work
		w, err = event.Parse[event.Work](data)
		r.WorkID = w.WorkID
	case kind == event.KindResult:
		var res event.Result
		res, err = event.Parse[event.Result](data)
		r.WorkID, r.AttemptID, r.Outcome = res.WorkID, res.AttemptID, res.Outcome
		r.Payload = maskLease(r.Payload, res.LeaseToken)
	case kind == event.KindAttempt:
		var a event.Attempt
		a, err = event.Parse[event.Attempt](data)
		r.WorkID, r.AttemptID, r.Outcome = a.WorkID, a.AttemptID, a.Outcome
		if a.Result != nil {
			r.Payload = maskLease(r.Payload, a.Result.LeaseToken)
		}
	case kind == event.KindOutcome:
		var o event.Outcome
		o, err = event.Parse[event.Outcome](data)
		r.WorkID, r.Outcome = o.WorkID, o.Outcome
	}
	if err != nil {
		r.DecodeError = err.Error()
	}
	return r
}

// streamRead is what reading one stream found.
type streamRead struct {
	Stream string `json:"stream"`
	// Cell is the cell the stream is of, named when the read follows a
	// tenant that moved between cells.
	Cell string `json:"cell,omitempty"`
	// Held is how many messages the stream held when the read began;
	// Read how many the ordered consumer delivered, Selected how many of
	// them the selection kept.
	Held     uint64 `json:"held"`
	Read     int    `json:"read"`
	Selected int    `json:"selected"`
}

// name is the stream's, and its cell's when the read names it.
func (r streamRead) name() string {
	if r.Cell != "" {
		return r.Stream + " (cell " + r.Cell + ")"
	}
	return r.Stream
}

// readSelection reads the selected messages of every selected stream, in
// stream order, through an ordered consumer per stream that is deleted
// when the read ends, and hands each to each.
func readSelection(ctx context.Context, js jetstream.JetStream, n event.Names, sel selection, bar *progress,
	each func(ReplayMsg) error) ([]streamRead, error) {
	var out []streamRead
	for _, kind := range sel.kinds {
		r, err := readStream(ctx, js, n, kind, sel, bar, each)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// errDone ends a read early.
var errDone = errors.New("done")

// readStream is readSelection's read of kind's stream: its selected
// messages up to the last it held when the read began, each handed to each.
func readStream(ctx context.Context, js jetstream.JetStream, n event.Names, kind string, sel selection, bar *progress,
	each func(ReplayMsg) error) (streamRead, error) {
	name := n.Stream(kind)
	res := streamRead{Stream: name}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return res, fmt.Errorf("stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	res.Held = info.State.Msgs
	// The read ends at the stream's last message when it began: a replay
	// is of history, not of what arrives while it runs.
	last := info.State.LastSeq
	if sel.toSeq != 0 {
		last = min(last, sel.toSeq)
	}
	if info.State.Msgs == 0 || (sel.fromSeq != 0 && sel.fromSeq > last) {
		return res, nil
	}
	cons, err := st.OrderedConsumer(ctx, sel.consumerConfig(n, kind))
	if err != nil {
		return res, fmt.Errorf("stream %s: ordered consumer: %w", name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return res, fmt.Errorf("stream %s: ordered consumer: %w", name, err)
	}
	r := &orderedRead{n: n, kind: kind, name: name, sel: sel, last: last, bar: bar, each: each, cons: cons, res: &res}
	if ci := cons.CachedInfo(); ci != nil {
		r.consName = ci.Name
	}
	defer r.close(ctx, js, it)
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	pending := uint64(0)
	if ci := cons.CachedInfo(); ci != nil {
		pending = ci.NumPending
	}
	if pending == 0 {
		return res, nil
	}
	bar.start(name, pending)
	defer bar.finish()
	err = r.read(ctx, it)
	return res, err
}

// consumerConfig is the ordered consumer that delivers sel's messages of
// kind's stream, from its first sequence or its start time.
func (sel selection) consumerConfig(n event.Names, kind string) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: sel.filters(n, kind), InactiveThreshold: 30 * time.Second}
	switch {
	case sel.fromSeq != 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, sel.fromSeq
	case !sel.since.IsZero():
		since := sel.since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	return cfg
}

// orderedRead is one stream's read through an ordered consumer of its own.
type orderedRead struct {
	n          event.Names
	kind, name string
	sel        selection
	last       uint64 // the last sequence read
	bar        *progress
	each       func(ReplayMsg) error
	cons       jetstream.Consumer
	consName   string // the consumer's name: a reset makes a new consumer
	res        *streamRead
}

// close stops the read and deletes its ordered consumer: it leaves
// nothing behind.
func (r *orderedRead) close(ctx context.Context, js jetstream.JetStream, it jetstream.MessagesContext) {
	it.Stop()
	if r.consName != "" {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = js.DeleteConsumer(dctx, r.name, r.consName)
		cancel()
	}
}

// read hands each selected message of it to each, counting them in res,
// until the last sequence, the selection's end, or each's errDone.
func (r *orderedRead) read(ctx context.Context, it jetstream.MessagesContext) error {
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("stream %s: reading: %w", r.name, err)
		}
		if ci := r.cons.CachedInfo(); ci != nil {
			r.consName = ci.Name // a reset makes a new consumer
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("stream %s: %w", r.name, err)
		}
		seq := meta.Sequence.Stream
		if seq > r.last || (!r.sel.until.IsZero() && !meta.Timestamp.Before(r.sel.until)) {
			return nil
		}
		r.res.Read++
		r.bar.step()
		msg := decodeMsg(r.n, r.kind, m, meta)
		if len(r.sel.works) == 0 || r.sel.works[msg.WorkID] {
			r.res.Selected++
			if err := r.each(msg); errors.Is(err, errDone) {
				return nil
			} else if err != nil {
				return err
			}
		}
		if meta.NumPending == 0 || seq == r.last {
			return nil
		}
	}
}

// A tenant moved between cells of its region leaves its events where they
// were made: those of the time a cell served it are in that cell's
// streams. A replay of the tenant (and work show's messages) follows it:
// it reads each cell's streams for the time that cell served the tenant,
// as the placement map's hops say, and names the cell of each message.

// span is a time one cell served a tenant that moved. A zero bound is
// open.
type span struct {
	cell         string
	since, until time.Time
}

// spans are the times each cell served a tenant, oldest first, as its
// hops say: the first hop's From from the beginning until that hop, each
// hop's To from it until the next hop, the last until now. None without
// hops.
func spans(hops []placement.Hop) []span {
	if len(hops) == 0 {
		return nil
	}
	hops = slices.Clone(hops)
	slices.SortStableFunc(hops, func(a, b placement.Hop) int { return a.At.Compare(b.At) })
	out := []span{{cell: hops[0].From, until: hops[0].At}}
	for i, h := range hops {
		sp := span{cell: h.To, since: h.At}
		if i+1 < len(hops) {
			sp.until = hops[i+1].At
		}
		out = append(out, sp)
	}
	return out
}

// within narrows sel's time to sp's; ok is false when they do not meet.
func (sel selection) within(sp span) (s selection, ok bool) {
	if !sp.since.IsZero() && sp.since.After(sel.since) {
		sel.since = sp.since
	}
	if !sp.until.IsZero() && (sel.until.IsZero() || sp.until.Before(sel.until)) {
		sel.until = sp.until
	}
	return sel, sel.since.IsZero() || sel.until.IsZero() || sel.since.Before(sel.until)
}

// cellNATSVar is the variable that names another cell's NATS when it is
// not this cell's: ASSAY_NATS_URL_US_2 for us-2.
func cellNATSVar(cell string) string {
	return "ASSAY_NATS_URL_" + strings.ToUpper(strings.ReplaceAll(cell, "-", "_"))
}

// regionCells reaches the streams of the region's cells: a cell's through
// this cell's connection (the cells of a region may share an account),
// unless ASSAY_NATS_URL_<CELL> names another server for it.
type regionCells struct {
	cfg    config.Config
	js     jetstream.JetStream // this cell's
	byCell map[string]jetstream.JetStream
	conns  []*nats.Conn // those made for other cells
}

// newRegionCells reaches the cells of cfg's region, this one's through js.
func newRegionCells(cfg config.Config, js jetstream.JetStream) *regionCells {
	return &regionCells{cfg: cfg, js: js, byCell: map[string]jetstream.JetStream{}}
}

// names are cell's names: its streams and their subjects.
func (c *regionCells) names(cell string) event.Names {
	return event.Names{Installation: c.cfg.Installation, Cell: cell}
}

// streams is the connection cell's streams are read through.
func (c *regionCells) streams(cell string) (jetstream.JetStream, error) {
	if cell == c.cfg.Cell {
		return c.js, nil
	}
	if js, ok := c.byCell[cell]; ok {
		return js, nil
	}
	url := os.Getenv(cellNATSVar(cell))
	if url == "" {
		c.byCell[cell] = c.js
		return c.js, nil
	}
	nc, err := nats.Connect(url, nats.Name("assay-operator-"+c.cfg.Region), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", cellNATSVar(cell), config.Redacted(url), config.RedactError(err, url))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%s %s: %w", cellNATSVar(cell), config.Redacted(url), config.RedactError(err, url))
	}
	c.conns = append(c.conns, nc)
	c.byCell[cell] = js
	return js, nil
}

func (c *regionCells) close() {
	for _, nc := range c.conns {
		nc.Close()
	}
	c.conns = nil
}

// following is a read of one tenant that follows it across the cells that
// served it.
type following struct {
	tenant string
	spans  []span
	cells  *regionCells
}

// placementMap is the region's placement map, to read: in the region's
// account when ASSAY_PLACEMENT_NATS_URL names it, else in the cell's own
// (js). kv is nil when the map was never made. done closes the connection
// it made.
func placementMap(ctx context.Context, cfg config.Config, js jetstream.JetStream) (kv jetstream.KeyValue, done func(), err error) {
	done = func() {}
	if u := os.Getenv("ASSAY_PLACEMENT_NATS_URL"); u != "" {
		nc, pjs, err := placement.Connect(u, "assay-operator-"+cfg.Region)
		if err != nil {
			return nil, done, err
		}
		js, done = pjs, nc.Close
	}
	bucket := cfg.Names().PlacementBucket(cfg.Region)
	kv, err = js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, done, nil
	}
	if err != nil {
		done()
		return nil, func() {}, fmt.Errorf("the region's placement map (%s), where a tenant's moves between cells are kept: %w", bucket, err)
	}
	return kv, done, nil
}

// followTenant is the read that follows tenant across the cells that
// served it, read from the placement map; nil when it never moved: its
// events are then read from this cell's streams (js), as ever. Close it
// when done.
func followTenant(ctx context.Context, cfg config.Config, js jetstream.JetStream, tenant string) (*following, error) {
	kv, done, err := placementMap(ctx, cfg, js)
	if err != nil || kv == nil {
		return nil, err
	}
	defer done()
	hops, err := placement.History(ctx, kv, tenant)
	if err != nil {
		return nil, err
	}
	return followHops(cfg, js, tenant, hops)
}

// followHops is followTenant of tenant's hops.
func followHops(cfg config.Config, js jetstream.JetStream, tenant string, hops []placement.Hop) (*following, error) {
	sp := spans(hops)
	if len(sp) == 0 {
		return nil, nil
	}
	for _, s := range sp {
		if !event.ValidToken(s.cell) {
			return nil, fmt.Errorf("the placement map's history of %s names cell %q, which is not a cell id", tenant, s.cell)
		}
	}
	return &following{tenant: tenant, spans: sp, cells: newRegionCells(cfg, js)}, nil
}

func (f *following) close() {
	if f != nil {
		f.cells.close()
	}
}

// cellsSaid names the cells f reads and when, for a person.
func (f *following) cellsSaid() string {
	var parts []string
	for _, s := range f.spans {
		switch {
		case s.since.IsZero():
			parts = append(parts, fmt.Sprintf("%s until %s", s.cell, s.until.UTC().Format(time.RFC3339)))
		case s.until.IsZero():
			parts = append(parts, fmt.Sprintf("%s since %s", s.cell, s.since.UTC().Format(time.RFC3339)))
		default:
			parts = append(parts, fmt.Sprintf("%s from %s until %s", s.cell, s.since.UTC().Format(time.RFC3339), s.until.UTC().Format(time.RFC3339)))
		}
	}
	return strings.Join(parts, ", ")
}

// read is readSelection following the tenant: each selected stream of each
// cell for the time the cell served the tenant, the cells oldest first,
// so that each stream's messages come in time order across the cells;
// each message names its cell.
func (f *following) read(ctx context.Context, sel selection, bar *progress, each func(ReplayMsg) error) ([]streamRead, error) {
	var out []streamRead
	for _, kind := range sel.kinds {
		for _, sp := range f.spans {
			s, ok := sel.within(sp)
			if !ok {
				continue
			}
			js, err := f.cells.streams(sp.cell)
			if err != nil {
				return out, err
			}
			cell := sp.cell
			r, err := readStream(ctx, js, f.cells.names(cell), kind, s, bar, func(m ReplayMsg) error {
				m.Cell = cell
				return each(m)
			})
			r.Cell = cell
			if err != nil {
				return out, fmt.Errorf("cell %s: %w", cell, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// readTenant is readSelection through f when it is not nil: following the
// tenant across the cells that served it.
func readTenant(ctx context.Context, f *following, js jetstream.JetStream, n event.Names, sel selection, bar *progress,
	each func(ReplayMsg) error) ([]streamRead, error) {
	if f != nil {
		return f.read(ctx, sel, bar, each)
	}
	return readSelection(ctx, js, n, sel, bar, each)
}
