package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
)

// Stranded work is work no one is moving: running past its lease with no
// worker holding it, or queued with its announcement gone — published
// before the first announcement its lane's consumer still holds (or with
// the lane caught up), or set aside; not waiting for the relay nor for a
// retry. The harness looks every
// second, from outside the services, and keeps each item's episodes:
// when it was first seen stranded and when it was back in flight (claimed
// again, or ended). Invariant s holds each episode to the fault it began
// under: back in flight within 60s of that fault's end.
type strandWatch struct {
	mu   sync.Mutex
	open map[string]*strandEpisode
	last map[string]*strandEpisode // each work item's latest episode
	all  []*strandEpisode
	// samples is how many looks at the cells answered.
	samples int
}

type strandEpisode struct {
	WorkID, Region, State string
	From, To              time.Time // To is zero while it is stranded
}

func newStrandWatch() *strandWatch {
	return &strandWatch{open: map[string]*strandEpisode{}, last: map[string]*strandEpisode{}}
}

// strandLimit is how long after its fault's end stranded work may stay
// stranded.
const strandLimit = 60 * time.Second

// startStrandWatch watches for stranded work in the cluster mode until
// the function it returns is called (which waits for the watch to end;
// calling it again does nothing).
func (h *Harness) startStrandWatch(ctx context.Context) func() {
	if h.cl == nil {
		return func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.watchStranded(wctx) }()
	return func() { cancel(); <-done }
}

// watchStranded samples every second until ctx ends.
func (h *Harness) watchStranded(ctx context.Context) {
	w := h.strands
	js := map[string]jetstream.JetStream{}
	for _, region := range config.DefaultRegions {
		j, closeJS, err := h.jetStream(region)
		if err != nil {
			h.note("stranded work not watched in %s: %v", region, err)
			continue
		}
		defer closeJS()
		js[region] = j
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		seen := map[string]*strandEpisode{}
		answered := true
		for _, region := range config.DefaultRegions {
			ids, err := h.strandedNow(ctx, region, js[region])
			if err != nil {
				answered = false
				continue
			}
			for id, state := range ids {
				seen[id] = &strandEpisode{WorkID: id, Region: region, State: state}
			}
		}
		w.update(now, seen, answered)
	}
}

// update opens an episode for work newly stranded and closes the episodes
// of work no longer stranded. A look that did not answer closes nothing.
// Work stranded again within 10s of its last episode's end continues it
// (the sweeper moves an expired lease to now when it announces the work
// again, so work it keeps announcing in vain blinks).
func (w *strandWatch) update(now time.Time, seen map[string]*strandEpisode, answered bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if answered {
		w.samples++
	}
	for id, e := range seen {
		if w.open[id] != nil {
			continue
		}
		if last := w.last[id]; last != nil && !last.To.IsZero() && now.Sub(last.To) < 10*time.Second {
			last.To = time.Time{}
			w.open[id] = last
			continue
		}
		e.From = now
		w.open[id], w.last[id] = e, e
		w.all = append(w.all, e)
	}
	if !answered {
		return
	}
	for id, e := range w.open {
		if seen[id] == nil {
			e.To = now
			delete(w.open, id)
		}
	}
}

// strandedNow is the cell's stranded work, by id, with its state.
func (h *Harness) strandedNow(ctx context.Context, region string, js jetstream.JetStream) (map[string]string, error) {
	var lanes []string
	var heads []time.Time
	if js != nil {
		for _, lane := range event.Lanes {
			if head, ok := laneHead(ctx, js, event.Names{Cell: region}, lane); ok {
				lanes, heads = append(lanes, lane), append(heads, head)
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// Queued work is stranded when its latest announcement is neither
	// waiting for the relay nor held by its lane's consumer: published
	// before the head (acknowledged, or lost), or set aside. An
	// announcement with no outbox row (the ingress publishes a new work's
	// own) was published, if at all, when the row was written.
	rows, err := h.pool[region].Query(cctx, `SELECT w.id, w.state FROM work w
		LEFT JOIN unnest($1::text[], $2::timestamptz[]) AS x(lane, head) ON x.lane = w.lane
		WHERE (w.state = 'running' AND w.lease_expires_at < now() - interval '1 second')
			OR (w.state = 'queued' AND x.head IS NOT NULL
				AND greatest(w.updated_at, coalesce(w.retry_at, w.updated_at)) < now() - interval '5 seconds'
				AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = w.id || '.' || w.dispatch
					AND NOT EXISTS (SELECT 1 FROM outbox_waiting q WHERE q.id = o.id AND q.set_aside_at IS NOT NULL)
					AND (o.published_at IS NULL OR o.published_at >= x.head - interval '1 second'))
				AND NOT (w.updated_at >= x.head - interval '1 second'
					AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = w.id || '.' || w.dispatch)))`, lanes, heads)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			return nil, err
		}
		out[id] = state
	}
	return out, rows.Err()
}

// laneHead is the time of the first announcement a lane's consumer has
// not finished with, or now when it holds none; ok is false when the
// broker did not say.
func laneHead(ctx context.Context, js jetstream.JetStream, n event.Names, lane string) (time.Time, bool) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	now := time.Now()
	cons, err := js.Consumer(cctx, n.Stream(event.KindWork), n.WorkConsumer(lane))
	if err != nil {
		return time.Time{}, false
	}
	info := cons.CachedInfo()
	if info.NumPending == 0 && info.NumAckPending == 0 {
		return now, true
	}
	st, err := js.Stream(cctx, n.Stream(event.KindWork))
	if err != nil {
		return time.Time{}, false
	}
	m, err := st.GetMsg(cctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(n.Lane(lane)))
	if err != nil {
		return time.Time{}, false
	}
	return m.Time, true
}

// strandFigures attributes each episode to the latest fault it began
// under (from the fault until 60s after its end) and measures how long
// after that fault's end it was back in flight.
type strandFigures struct {
	perFault   map[*faultRecord][]time.Duration
	unassigned []*strandEpisode
	open       []*strandEpisode
	episodes   int
}

func (w *strandWatch) figures(sched []*faultRecord) strandFigures {
	w.mu.Lock()
	defer w.mu.Unlock()
	fig := strandFigures{perFault: map[*faultRecord][]time.Duration{}, episodes: len(w.all)}
	for _, e := range w.all {
		var owner *faultRecord
		for _, f := range sched {
			if f.Fired.IsZero() || f.Done.IsZero() || e.From.Before(f.Fired) || e.From.After(f.Done.Add(strandLimit)) {
				continue
			}
			if owner == nil || f.Fired.After(owner.Fired) {
				owner = f
			}
		}
		switch {
		case e.To.IsZero():
			fig.open = append(fig.open, e)
		case owner == nil:
			fig.unassigned = append(fig.unassigned, e)
		default:
			fig.perFault[owner] = append(fig.perFault[owner], max(0, e.To.Sub(owner.Done)))
		}
	}
	return fig
}

// strandCheck is invariant s.
func (h *Harness) strandCheck(sched []*faultRecord) (check, strandFigures) {
	fig := h.strands.figures(sched)
	var bad []string
	var slowest time.Duration
	var slowFault string
	for f, ds := range fig.perFault {
		for _, d := range ds {
			if d > slowest {
				slowest, slowFault = d, f.label()
			}
			if d > strandLimit {
				bad = append(bad, fmt.Sprintf("%s: stranded work back in flight %s after its end", f.label(), d.Round(time.Second)))
			}
		}
	}
	for _, e := range fig.unassigned {
		bad = append(bad, fmt.Sprintf("%s %s (%s) stranded %s with no fault running, for %s", e.WorkID, e.State, e.Region,
			e.From.Sub(h.started).Round(time.Second), e.To.Sub(e.From).Round(time.Second)))
	}
	for _, e := range fig.open {
		bad = append(bad, fmt.Sprintf("%s %s (%s) stranded since %s, never back in flight", e.WorkID, e.State, e.Region,
			e.From.Sub(h.started).Round(time.Second)))
	}
	sort.Strings(bad)
	figure := fmt.Sprintf("%d episodes in %d looks; slowest back in flight %s after its fault's end", fig.episodes,
		h.strands.samples, slowest.Round(100*time.Millisecond))
	if slowFault != "" {
		figure += " (" + slowFault + ")"
	}
	figure += fmt.Sprintf("; %d stranded with no fault running, %d never back", len(fig.unassigned), len(fig.open))
	return check{N: "s", What: "stranded work (leased past its lease, or queued with its announcement gone) back in flight within 60s of its fault's end",
		Figure: figure, OK: len(bad) == 0, Offenders: bad}, fig
}
