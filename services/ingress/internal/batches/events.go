package batches

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/host"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/services/ingress/internal/door"
)

// Server-sent events of one work item and of one batch.
//
// Nothing is written for them on the path of the work: each stream reads
// the rows the work already leaves (the work row, its attempts, its
// result, its review item) every EventsEvery and tells its subscriber the
// facts it has not had yet. An event's id is not a counter but a mark of
// every fact delivered up to and including it, so a client that resumes
// with Last-Event-ID gets exactly the facts the mark lacks: none twice,
// none skipped, even when the rows changed out of order meanwhile (an
// attempt whose worker reports after the next attempt began).

// sseEvent is one event to send: its id, its name and its data.
type sseEvent struct {
	ID   string
	Name string
	Data any
}

// workMark is what a subscriber of one work item has had: the queued event
// (any mark has it), the start of attempts 1..started, the end of the
// attempts in finished, the ending whose key is ending ("" none) and, when
// requeued, the queued event after it; review 1 is the review item, 2 its
// resolution.
type workMark struct {
	started  int
	finished map[int]bool
	ending   string
	requeued bool
	review   int
}

// String is the mark as an event id: w1.<started>.<finished>.<ending>.<review>,
// finished being the longest run 1..p followed by +n for each other one.
func (m *workMark) String() string {
	p := 0
	for m.finished[p+1] {
		p++
	}
	fin := strconv.Itoa(p)
	var extra []int
	for n := range m.finished {
		if n > p {
			extra = append(extra, n)
		}
	}
	slices.Sort(extra)
	for _, n := range extra {
		fin += "+" + strconv.Itoa(n)
	}
	ending := "-"
	if m.ending != "" {
		ending = m.ending
		if m.requeued {
			ending += "q"
		}
	}
	return "w1." + strconv.Itoa(m.started) + "." + fin + "." + ending + "." + strconv.Itoa(m.review)
}

// maxMarkedAttempts bounds the attempt numbers a mark may name.
const maxMarkedAttempts = 10000

var errBadMark = errors.New("not an event id of this stream")

// parseWorkMark reads a work stream's event id; "" is a new subscriber
// (nil).
func parseWorkMark(id string) (*workMark, error) {
	if id == "" {
		return nil, nil
	}
	f := strings.Split(id, ".")
	if len(f) != 5 || f[0] != "w1" {
		return nil, errBadMark
	}
	m := &workMark{finished: map[int]bool{}}
	num := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0 && n <= maxMarkedAttempts && strconv.Itoa(n) == s
	}
	var ok bool
	if m.started, ok = num(f[1]); !ok {
		return nil, errBadMark
	}
	fins := strings.Split(f[2], "+")
	p, ok := num(fins[0])
	if !ok {
		return nil, errBadMark
	}
	for n := 1; n <= p; n++ {
		m.finished[n] = true
	}
	for _, x := range fins[1:] {
		n, ok := num(x)
		if !ok || n <= p+1 || m.finished[n] {
			return nil, errBadMark
		}
		m.finished[n] = true
	}
	if e := f[3]; e != "-" {
		m.ending, m.requeued = strings.CutSuffix(e, "q")
		if len(m.ending) != 8 || strings.Trim(m.ending, "0123456789abcdef") != "" {
			return nil, errBadMark
		}
	}
	if m.review, ok = num(f[4]); !ok || m.review > 2 {
		return nil, errBadMark
	}
	return m, nil
}

func (m *workMark) clone() *workMark {
	c := *m
	c.finished = make(map[int]bool, len(m.finished))
	for k, v := range m.finished {
		c.finished[k] = v
	}
	return &c
}

// endingKey names one ending of a work item: its outcome and when it was
// reached, so a re-run that ends again is a new ending.
func endingKey(w *store.Work) string {
	h := sha256.Sum256([]byte(w.State + "|" + w.UpdatedAt.UTC().Format(time.RFC3339Nano)))
	return hex.EncodeToString(h[:4])
}

// workHistory is what the rows tell of one work item.
type workHistory struct {
	Work     *store.Work
	Attempts []store.Attempt
	Result   *store.Result // nil unless accepted
	Review   *store.Review // nil when it has none
}

// over reports whether the work's story is told to its end: it has its
// outcome, and a person resolved its review item if it has one. A work
// stream ends there.
func (h workHistory) over() bool {
	return h.Work.Terminal() && (h.Review == nil || h.Review.State == store.ReviewResolved)
}

// workEvents decides which events a subscriber at mark has not had, in
// the order they are sent: queued; each attempt's start and end, by
// number; the ending (or a queued event when the work was queued again
// after the ending the subscriber had); the review item and its
// resolution. Each event carries the mark after it. It returns the mark
// after the last.
func workEvents(mark *workMark, h workHistory) ([]sseEvent, *workMark) {
	var out []sseEvent
	w := h.Work
	emit := func(m *workMark, name string, data api.WorkEvent) {
		data.WorkID = w.ID
		out = append(out, sseEvent{ID: m.String(), Name: name, Data: data})
	}
	if mark == nil {
		mark = &workMark{finished: map[int]bool{}}
		at := w.CreatedAt
		emit(mark, outcome.Queued, api.WorkEvent{State: outcome.Queued, At: &at})
	}
	m := mark.clone()
	for _, a := range h.Attempts {
		if a.Number > m.started && a.Number <= maxMarkedAttempts {
			// Starts are delivered in number order; numbers have no holes.
			m.started = a.Number
			at := a.StartedAt
			emit(m, outcome.Running, api.WorkEvent{State: outcome.Running, Attempt: a.Number, AttemptID: a.ID, At: &at})
		}
		if a.Outcome != outcome.Running && !m.finished[a.Number] && a.Number <= maxMarkedAttempts {
			m.finished[a.Number] = true
			emit(m, "attempt", api.WorkEvent{Attempt: a.Number, AttemptID: a.ID, Outcome: a.Outcome, Reason: a.Reason, At: a.FinishedAt})
		}
	}
	if w.Terminal() {
		if key := endingKey(w); m.ending != key || m.requeued {
			m.ending, m.requeued = key, false
			at := w.UpdatedAt
			ev := api.WorkEvent{State: w.State, Outcome: w.State, Reason: w.Reason, At: &at}
			if h.Result != nil {
				ev.Output = h.Result.Output
			}
			emit(m, w.State, ev)
		}
	} else if m.ending != "" && !m.requeued {
		m.requeued = true
		at := w.UpdatedAt
		emit(m, outcome.Queued, api.WorkEvent{State: w.State, Reason: "queued again after its outcome", At: &at})
	}
	if v := h.Review; v != nil {
		if m.review < 1 {
			m.review = 1
			at := v.CreatedAt
			emit(m, "review", api.WorkEvent{ReviewID: story.ReviewID(v), Reason: v.Reason, At: &at})
		}
		if v.State == store.ReviewResolved && m.review < 2 {
			m.review = 2
			at := v.ResolvedAt
			emit(m, "resolved", api.WorkEvent{ReviewID: story.ReviewID(v), Verdict: v.Verdict, By: v.ResolvedBy, At: &at})
		}
	}
	return out, m
}

// readHistory reads what the rows tell of one work item now, from one
// snapshot.
func (s *Room) readHistory(ctx context.Context, id string) (workHistory, error) {
	h, err := s.D.Store.WorkHistory(ctx, id)
	if err != nil {
		return workHistory{}, err
	}
	out := workHistory{Work: h.Work, Attempts: h.Attempts, Review: h.Review}
	if h.Work.State == outcome.Accepted {
		out.Result = h.Result
	}
	return out, nil
}

// stream is one open event stream.
type stream struct {
	w         http.ResponseWriter
	rc        *http.ResponseController
	heartbeat time.Duration
	last      time.Time // when something was last written
	checked   time.Time // when the credential was last checked
}

// open takes a stream slot for the tenant and starts the answer, or writes
// the refusal.
func (s *Room) openStream(w http.ResponseWriter, t store.Tenant) (*stream, func(), bool) {
	release, ok := s.EventStreams.Take(t.ID, s.Cfg.EventStreams)
	if !ok {
		door.RetryLater(w, "too_many_streams",
			fmt.Sprintf("this tenant holds %d event streams open already on this instance; close one first", s.Cfg.EventStreams), door.StreamsFullWait)
		return nil, nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	st := &stream{w: w, rc: http.NewResponseController(w), heartbeat: s.Cfg.EventsHeartbeat, checked: time.Now()}
	return st, release, st.write("retry: 2000\n\n")
}

// over answers a subscriber that resumes a stream it has had all of:
// 204, which tells an EventSource to stop reconnecting.
func over(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }

// end sends the stream's final event, named end, and the stream ends.
func (st *stream) end(why string) {
	data, _ := json.Marshal(map[string]string{"reason": why})
	st.write("event: end\ndata: " + string(data) + "\n\n")
}

// write sends a frame, bounded by a write deadline so a client that stops
// reading is let go.
func (st *stream) write(frame string) bool {
	_ = st.rc.SetWriteDeadline(time.Now().Add(st.heartbeat + 5*time.Second))
	if _, err := st.w.Write([]byte(frame)); err != nil {
		return false
	}
	st.last = time.Now()
	return st.rc.Flush() == nil
}

func (st *stream) send(ev sseEvent) bool {
	data, _ := json.Marshal(ev.Data)
	return st.write("id: " + ev.ID + "\nevent: " + ev.Name + "\ndata: " + string(data) + "\n\n")
}

// wait waits for the next look at the rows, checking the credential
// again every EventsRecheck whatever the stream sends, and sending a
// heartbeat when it was quiet for a while. It is false when the stream is
// over: the client went, the server drains, or the credential no longer
// holds (a suspension, a revocation), which is told in a final event
// named closed.
func (s *Room) wait(ctx context.Context, r *http.Request, st *stream) bool {
	select {
	case <-ctx.Done():
		return false
	case <-host.Draining(ctx):
		st.write("event: bye\ndata: {\"reason\":\"the server is shutting down; resume with Last-Event-ID\"}\n\n")
		return false
	case <-time.After(min(s.Cfg.EventsEvery, time.Until(st.checked.Add(s.Cfg.EventsRecheck)))):
	}
	if time.Since(st.checked) >= s.Cfg.EventsRecheck {
		_, refused := auth.Bearer(ctx, s.Tokens, r.Header.Get("Authorization"), s.Cell())
		switch {
		case refused == nil:
			st.checked = time.Now()
		case refused.Status == http.StatusServiceUnavailable:
			// The database did not answer: the stream goes on and asks
			// again at the next look.
		default:
			body, _ := json.Marshal(apierror.Body{Error: apierror.Detail{Code: refused.Code, Message: refused.Message}})
			st.write("event: closed\ndata: " + string(body) + "\n\n")
			return false
		}
	}
	if time.Since(st.last) < st.heartbeat {
		return true
	}
	return st.write(": heartbeat\n\n")
}

// workEventStream serves GET /v1/work/{id}/events. The stream only reads:
// a client that goes away cancels nothing.
func (s *Room) workEventStream(w http.ResponseWriter, r *http.Request) {
	t, ok := s.Authenticate(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	id := r.PathValue("id")
	h, err := s.readHistory(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && h.Work.TenantID != t.ID) {
		apierror.Write(w, http.StatusNotFound, "not_found", "no work with that id for this tenant")
		return
	}
	if err != nil {
		s.D.Log.Error("read work history failed", "key", id, "err", err)
		auth.Unavailable().Write(w)
		return
	}
	// Work of a tenant that moved here, still finished by the cell it left:
	// that cell streams its events, as it answers the work itself.
	if h.Work.State == outcome.Elsewhere && s.SendToFinisher(w, r, t.ID, id, nil) {
		return
	}
	mark, err := parseWorkMark(r.Header.Get("Last-Event-ID"))
	if err != nil {
		apierror.Write(w, http.StatusBadRequest, "invalid_last_event_id", "Last-Event-ID: "+err.Error())
		return
	}
	if mark != nil && h.over() {
		if evs, _ := workEvents(mark, h); len(evs) == 0 {
			over(w)
			return
		}
	}
	st, release, ok := s.openStream(w, t)
	if !ok {
		return
	}
	defer release()
	for {
		var evs []sseEvent
		evs, mark = workEvents(mark, h)
		for _, ev := range evs {
			if !st.send(ev) {
				return
			}
		}
		if h.over() {
			why := "the work has its outcome"
			if h.Review != nil {
				why = "the work has its outcome and its review item was resolved"
			}
			st.end(why)
			return
		}
		if !s.wait(ctx, r, st) {
			return
		}
		fresh, err := s.readHistory(ctx, id)
		if err == nil {
			h = fresh
		} else {
			if ctx.Err() != nil {
				return
			}
			// The stream goes on with what it had; the next look catches up.
			s.D.Log.Warn("work events: read failed; the stream goes on", "key", id, "err", err)
		}
	}
}

// batchMark is what a subscriber of a batch has had: the queued event (any
// mark has it), the ending of each item whose bit is set (items in item id
// order, bytewise), the canceled and the complete event. As an event id:
// b1.<bits, base64url>.<flags c and d>.
type batchMark struct {
	ended    []byte
	canceled bool
	complete bool
}

func (m *batchMark) String() string {
	flags := ""
	if m.canceled {
		flags += "c"
	}
	if m.complete {
		flags += "d"
	}
	return "b1." + base64.RawURLEncoding.EncodeToString(m.ended) + "." + flags
}

func (m *batchMark) count() int {
	n := 0
	for _, b := range m.ended {
		n += bits.OnesCount8(b)
	}
	return n
}

func parseBatchMark(id string, total int) (*batchMark, error) {
	if id == "" {
		return nil, nil
	}
	f := strings.Split(id, ".")
	if len(f) != 3 || f[0] != "b1" {
		return nil, errBadMark
	}
	ended, err := base64.RawURLEncoding.DecodeString(f[1])
	if err != nil || len(ended) != (total+7)/8 {
		return nil, errBadMark
	}
	m := &batchMark{ended: ended}
	switch f[2] {
	case "":
	case "c":
		m.canceled = true
	case "d":
		m.complete = true
	case "cd":
		m.canceled, m.complete = true, true
	default:
		return nil, errBadMark
	}
	return m, nil
}

// batchEvents decides which events a subscriber at mark has not had:
// queued, then each ended item it has not had, in item order, then
// canceled and complete. items are every item of the batch in item order.
func batchEvents(mark *batchMark, b *store.Batch, items []store.BatchItem) ([]sseEvent, *batchMark) {
	var out []sseEvent
	emit := func(m *batchMark, name string, data api.BatchEvent) {
		data.BatchID, data.Total, data.Ended = b.ID, b.ItemCount, m.count()
		out = append(out, sseEvent{ID: m.String(), Name: name, Data: data})
	}
	if mark == nil {
		mark = &batchMark{ended: make([]byte, (b.ItemCount+7)/8)}
		at := b.CreatedAt
		emit(mark, outcome.Queued, api.BatchEvent{At: &at})
	}
	m := &batchMark{ended: slices.Clone(mark.ended), canceled: mark.canceled, complete: mark.complete}
	for i, it := range items {
		if i >= b.ItemCount || !outcome.IsTerminal(it.State) || m.ended[i/8]&(1<<(i%8)) != 0 {
			continue
		}
		m.ended[i/8] |= 1 << (i % 8)
		at := it.UpdatedAt
		emit(m, it.State, api.BatchEvent{ItemID: it.ItemID, WorkID: it.WorkID, Outcome: it.State, Reason: it.Reason, At: &at})
	}
	if !b.CanceledAt.IsZero() && !m.canceled {
		m.canceled = true
		at := b.CanceledAt
		emit(m, outcome.Canceled, api.BatchEvent{Reason: "the batch was canceled", At: &at})
	}
	if !m.complete && m.count() == b.ItemCount {
		m.complete = true
		emit(m, "complete", api.BatchEvent{})
	}
	return out, m
}

// allItems reads every item of a batch, in item order.
func allItems(ctx context.Context, bs door.BatchStore, id string) ([]store.BatchItem, error) {
	var all []store.BatchItem
	after := ""
	for {
		page, err := bs.BatchItems(ctx, store.BatchItemFilter{BatchID: id, After: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < 1000 {
			return all, nil
		}
		after = page[len(page)-1].ItemID
	}
}

// batchEventStream serves GET /v1/batches/{id}/events. It reads the items
// again only when the batch's progress summary changed.
func (s *Room) batchEventStream(w http.ResponseWriter, r *http.Request) {
	t, b, ok := s.tenantBatch(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	mark, err := parseBatchMark(r.Header.Get("Last-Event-ID"), b.ItemCount)
	if err != nil {
		apierror.Write(w, http.StatusBadRequest, "invalid_last_event_id", "Last-Event-ID: "+err.Error())
		return
	}
	if mark != nil && mark.complete {
		over(w)
		return
	}
	st, release, ok := s.openStream(w, t)
	if !ok {
		return
	}
	defer release()
	var seen *store.BatchSignal
	for {
		sig, err := s.D.Store.BatchSignal(ctx, b.ID)
		if err == nil && (seen == nil || sig != *seen) {
			var items []store.BatchItem
			if items, err = allItems(ctx, s.D.Store, b.ID); err == nil {
				if sig.CanceledAt.After(time.Unix(0, 0)) {
					b.CanceledAt = sig.CanceledAt
				}
				var evs []sseEvent
				evs, mark = batchEvents(mark, b, items)
				for _, ev := range evs {
					if !st.send(ev) {
						return
					}
				}
				seen = &sig
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.D.Log.Warn("batch events: read failed; the stream goes on", "key", b.ID, "err", err)
		}
		if mark != nil && mark.complete {
			st.end("every item of the batch has its outcome")
			return
		}
		if !s.wait(ctx, r, st) {
			return
		}
	}
}
