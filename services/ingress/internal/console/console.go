package console

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/auth"
	"assay.dev/pkg/event"
	"assay.dev/pkg/host"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/page"
)

// Console is what GET /v1/console answers and every snapshot event of
// /v1/console/events carries: the cell's work as one tenant sees it
// (scope "tenant": its own work and spend) or as an operator does (scope
// "cell": everyone's, and the consumers' lag).
type Console struct {
	Scope    string `json:"scope"`
	Tenant   string `json:"tenant,omitempty"`
	Operator string `json:"operator,omitempty"`
	Region   string `json:"region"`
	Cell     string `json:"cell"`
	// WindowSeconds is how far back States and Spend count: the last day.
	WindowSeconds int64            `json:"windowSeconds"`
	States        map[string]int64 `json:"states"`
	Lanes         []ConsoleLane    `json:"lanes"`
	Recent        []ConsoleOutcome `json:"recent"`
	// Consumers are the cell's durables; only an operator sees them.
	Consumers []ConsoleConsumer `json:"consumers,omitempty"`
	Spend     []ConsoleSpend    `json:"spend"`
	// Publications count the publications not made, per target: pending
	// ones are tried again until their deadline, failed ones wait for
	// assay publish retry; FailedPublications are the latest failed.
	Publications       []ConsolePublications `json:"publications"`
	FailedPublications []ConsoleFailed       `json:"failedPublications"`
	// Circuits are the cell's circuit per model: whether the provider
	// answers, the same for everyone.
	Circuits []ConsoleCircuit `json:"circuits"`
	// Rollouts are the contracts' routes that apply, each with its
	// candidate's shadow runs of the last hour (assay rollout compare has
	// their agreement with live work).
	Rollouts []ConsoleRollout `json:"rollouts"`
	At       time.Time        `json:"at"`
}

// ConsoleRollout is one route: what new work gets, the candidate beside
// it and how its shadow runs of the last hour ended.
type ConsoleRollout struct {
	Contract           string  `json:"contract"`
	Scope              string  `json:"scope"`
	Live               string  `json:"live"`
	Candidate          string  `json:"candidate,omitempty"`
	ShadowShare        float64 `json:"shadowShare"`
	Runs               int64   `json:"runs"`
	Open               int64   `json:"open"`
	Accepted           int64   `json:"accepted"`
	StructuralFailures int64   `json:"structuralFailures"`
	CostMicros         int64   `json:"costMicros"`
	LiveCostMicros     int64   `json:"liveCostMicros"`
	// Override, when set, is the change that made the live variant live
	// without a passed rollout check: who overrode the fence, and why.
	Override *ConsoleRouteChange `json:"override,omitempty"`
	// Changes are the route's last changes, newest first.
	Changes []ConsoleRouteChange `json:"changes"`
}

// ConsoleRouteChange is one change of a route: of its live variant
// (set-live, promote, override) or of its candidate (set-candidate).
type ConsoleRouteChange struct {
	At      time.Time `json:"at"`
	By      string    `json:"by"`
	Verb    string    `json:"verb"`
	From    string    `json:"from,omitempty"`
	To      string    `json:"to,omitempty"`
	CheckID int64     `json:"checkId,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

func consoleRouteChange(c store.RouteChange) ConsoleRouteChange {
	return ConsoleRouteChange{At: c.At.UTC(), By: c.By, Verb: c.Verb, From: c.From.Label(), To: c.To.Label(),
		CheckID: c.CheckID, Reason: c.Reason}
}

// ConsolePublications are one target's publications not made.
type ConsolePublications struct {
	Target  string `json:"target"`
	Pending int64  `json:"pending"`
	Failed  int64  `json:"failed"`
}

// ConsoleFailed is one failed publication.
type ConsoleFailed struct {
	WorkID   string    `json:"workId"`
	TenantID string    `json:"tenantId"`
	Target   string    `json:"target"`
	Outcome  string    `json:"outcome"`
	Tries    int       `json:"tries"`
	Reason   string    `json:"reason"`
	FailedAt time.Time `json:"failedAt"`
}

// ConsoleCircuit is the cell's circuit breaker of one model: closed, or
// open since a time, with the probes made and the next one due.
type ConsoleCircuit struct {
	Model       string     `json:"model"`
	State       string     `json:"state"`
	Since       time.Time  `json:"since"`
	Failures    int        `json:"failures,omitempty"`
	LastError   string     `json:"lastError,omitempty"`
	Probes      int        `json:"probes"`
	NextProbeAt *time.Time `json:"nextProbeAt,omitempty"`
}

// ConsoleLane is one lane's unfinished work.
type ConsoleLane struct {
	Lane          string  `json:"lane"`
	Queued        int64   `json:"queued"`
	Running       int64   `json:"running"`
	Depth         int64   `json:"depth"`
	OldestSeconds float64 `json:"oldestSeconds"`
}

// ConsoleOutcome is one work item that reached its outcome.
type ConsoleOutcome struct {
	WorkID     string    `json:"workId"`
	TenantID   string    `json:"tenantId"`
	Contract   string    `json:"contract"`
	Lane       string    `json:"lane"`
	Outcome    string    `json:"outcome"`
	FinishedAt time.Time `json:"finishedAt"`
}

// ConsoleConsumer is how far one durable consumer of the cell is behind:
// messages not yet delivered (pending) and delivered but not yet
// acknowledged (ack pending). Error says why it could not be read.
type ConsoleConsumer struct {
	Stream      string `json:"stream"`
	Durable     string `json:"durable"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ackPending"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting"`
	Error       string `json:"error,omitempty"`
}

// ConsoleSpend is one tenant's ledger over the window.
type ConsoleSpend struct {
	TenantID            string `json:"tenantId"`
	Calls               int64  `json:"calls"`
	CostMicros          int64  `json:"costMicros"`
	EstimatedCostMicros int64  `json:"estimatedCostMicros"`
}

// ConsoleRecent is how many ended work items the console lists.
const ConsoleRecent = 20

// ConsoleStates are the five states, in the order the console shows them.
var ConsoleStates = []string{store.ViewRunning, store.ViewAccepted, store.ViewNeedsReview, store.ViewRejected, store.ViewTerminal}

// Snapshot reads the console's figures as v may see them.
func (s *Room) Snapshot(ctx context.Context, v auth.Viewer) (*Console, error) {
	c := &Console{Scope: "cell", Region: s.Cfg.Region, Cell: s.Cfg.Names.Cell, WindowSeconds: int64(door.ViewWindow / time.Second),
		Lanes: []ConsoleLane{}, Recent: []ConsoleOutcome{}, Spend: []ConsoleSpend{}, At: time.Now().UTC()}
	tenant := ""
	if v.Tenant != nil {
		tenant, c.Scope, c.Tenant = v.Tenant.ID, "tenant", v.Tenant.ID
	} else {
		c.Operator = v.Operator.Name
	}
	f, err := s.D.Store.Console(ctx, door.ViewWindow, tenant, ConsoleRecent, c.At.Add(-door.ViewWindow))
	if err != nil {
		return nil, err
	}
	c.States = f.Views
	byLane := map[string]store.LaneFigures{}
	for _, l := range f.Lanes {
		byLane[l.Lane] = l
	}
	for _, lane := range event.Lanes {
		l := byLane[lane]
		c.Lanes = append(c.Lanes, ConsoleLane{Lane: lane, Queued: l.Queued, Running: l.Running, Depth: l.Queued + l.Running,
			OldestSeconds: l.Oldest.Seconds()})
	}
	for _, d := range f.Recent {
		c.Recent = append(c.Recent, ConsoleOutcome{WorkID: d.WorkID, TenantID: d.TenantID, Contract: d.Contract,
			Lane: d.Lane, Outcome: d.Outcome, FinishedAt: d.Finished.UTC()})
	}
	for _, sp := range f.Spend {
		c.Spend = append(c.Spend, ConsoleSpend{TenantID: sp.TenantID, Calls: sp.Calls, CostMicros: sp.CostMicros,
			EstimatedCostMicros: sp.EstimatedCostMicros})
	}
	if tenant != "" && len(c.Spend) == 0 {
		c.Spend = append(c.Spend, ConsoleSpend{TenantID: tenant})
	}
	c.publications(f)
	c.Rollouts = []ConsoleRollout{}
	for _, r := range f.Rollouts {
		cr := ConsoleRollout{Contract: r.Contract, Scope: r.Scope, Live: r.Live.Label(), ShadowShare: r.ShadowShare,
			Runs: r.Runs, Open: r.Open, Accepted: r.Accepted, StructuralFailures: r.StructuralFailures,
			CostMicros: r.CostMicros, LiveCostMicros: r.LiveCostMicros}
		if r.Candidate.Version != "" {
			cr.Candidate = r.Candidate.Label()
		}
		if r.Override != nil {
			o := consoleRouteChange(*r.Override)
			cr.Override = &o
		}
		cr.Changes = []ConsoleRouteChange{}
		for _, ch := range r.History {
			cr.Changes = append(cr.Changes, consoleRouteChange(ch))
		}
		c.Rollouts = append(c.Rollouts, cr)
	}
	if tenant == "" {
		c.Consumers = s.consumerLag(ctx)
	}
	return c, nil
}

// publications fills the console's publication and circuit figures:
// every target retried is listed, at 0 when nothing waits.
func (c *Console) publications(f store.ConsoleFigures) {
	c.Publications, c.FailedPublications, c.Circuits = []ConsolePublications{}, []ConsoleFailed{}, []ConsoleCircuit{}
	targets := []string{"github", "callback"}
	by := map[string]ConsolePublications{}
	for _, n := range f.Publications {
		if _, ok := by[n.Target]; !ok && !slices.Contains(targets, n.Target) {
			targets = append(targets, n.Target)
		}
		p := by[n.Target]
		switch n.State {
		case store.PublicationPending:
			p.Pending = n.Count
		case store.PublicationFailed:
			p.Failed = n.Count
		}
		by[n.Target] = p
	}
	for _, t := range targets {
		p := by[t]
		p.Target = t
		c.Publications = append(c.Publications, p)
	}
	for _, p := range f.Failed {
		c.FailedPublications = append(c.FailedPublications, ConsoleFailed{WorkID: p.WorkID, TenantID: p.TenantID, Target: p.Target,
			Outcome: p.Outcome, Tries: p.Tries, Reason: p.Reason, FailedAt: p.UpdatedAt.UTC()})
	}
	for _, k := range f.Circuits {
		cc := ConsoleCircuit{Model: k.Model, State: k.State, Since: k.Since.UTC(), Probes: k.Probes}
		if k.State == store.CircuitOpen {
			cc.Failures, cc.LastError = k.Failures, k.LastError
			if !k.NextProbeAt.IsZero() {
				at := k.NextProbeAt.UTC()
				cc.NextProbeAt = &at
			}
		}
		c.Circuits = append(c.Circuits, cc)
	}
}

// consumerLag reads each durable's progress from the server, all at once
// and within consumerInfoWait: a request the server refuses is dropped,
// not answered. A durable that cannot be read (not created yet, or this
// credential may not ask) says why instead.
func (s *Room) consumerLag(ctx context.Context) []ConsoleConsumer {
	ctx, cancel := context.WithTimeout(ctx, consumerInfoWait)
	defer cancel()
	durables := s.Cfg.Names.Durables()
	out := make([]ConsoleConsumer, len(durables))
	var wg sync.WaitGroup
	for i, d := range durables {
		wg.Go(func() {
			c := ConsoleConsumer{Stream: d.Stream, Durable: d.Durable}
			cons, err := s.D.JS.Consumer(ctx, d.Stream, d.Durable)
			if err != nil {
				c.Error = err.Error()
			} else {
				info := cons.CachedInfo()
				c.Pending, c.AckPending, c.Redelivered, c.Waiting = info.NumPending, info.NumAckPending, info.NumRedelivered, info.NumWaiting
			}
			out[i] = c
		})
	}
	wg.Wait()
	return out
}

// consumerInfoWait bounds the console's wait for the consumers' info.
const consumerInfoWait = 2 * time.Second

func (s *Room) consoleSnapshot(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	c, err := s.Snapshot(r.Context(), v)
	if err != nil {
		s.D.Log.Error("console: snapshot failed", "err", err)
		auth.Unavailable().Write(w)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	apierror.JSON(w, http.StatusOK, c)
}

// sharedSnapshot is Snapshot for a stream of v, from the scope's last
// snapshot while it is fresh enough.
func (s *Room) sharedSnapshot(ctx context.Context, v auth.Viewer) (*Console, error) {
	scope := ""
	if v.Tenant != nil {
		scope = v.Tenant.ID
	}
	s.shared.mu.Lock()
	c := s.shared.last[scope]
	s.shared.mu.Unlock()
	if c == nil || time.Since(c.At) >= s.Cfg.ConsoleEvery/2 {
		fresh, err := s.Snapshot(ctx, v)
		if err != nil {
			return nil, err
		}
		s.shared.mu.Lock()
		if s.shared.last == nil {
			s.shared.last = map[string]*Console{}
		}
		s.shared.last[scope] = fresh
		s.shared.mu.Unlock()
		c = fresh
	}
	out := *c // its slices are never written after the read
	out.Operator = ""
	if v.Operator != nil {
		out.Operator = v.Operator.Name
	}
	return &out, nil
}

// consoleHeartbeat is how often an idle stream says it is alive, well
// inside the idle timeouts of proxies on the way.
const consoleHeartbeat = 15 * time.Second

// consoleEvents streams snapshots as server-sent events: one at once, then
// one whenever the figures changed (ages included), looked for every
// ConsoleEvery, with a heartbeat comment when nothing changed for a while.
// The credential is checked again each time, so a revoked token's stream
// ends with an error event. The stream ends when the client goes, or the
// server drains.
func (s *Room) consoleEvents(w http.ResponseWriter, r *http.Request) {
	v, ok := s.Viewer(w, r)
	if !ok {
		return
	}
	release, ok := s.Open.Take(v.Key(), s.Cfg.ConsoleStreams)
	if !ok {
		door.RetryLater(w, "too_many_streams",
			fmt.Sprintf("this credential holds %d console streams open already; close one first", s.Cfg.ConsoleStreams), door.StreamsFullWait)
		return
	}
	defer release()
	ctx := r.Context()
	first, err := s.sharedSnapshot(ctx, v)
	if err != nil {
		s.D.Log.Error("console: snapshot failed", "err", err)
		auth.Unavailable().Write(w)
		return
	}
	cs := startConsoleStream(w)
	if !cs.snapshot(first) {
		return
	}
	s.followConsole(ctx, r, cs)
}

// followConsole sends a console stream a snapshot whenever the figures
// changed, looked for every ConsoleEvery with the credential checked
// again, and a heartbeat comment when nothing changed for a while, until
// the client goes, the server drains or the credential no longer holds.
func (s *Room) followConsole(ctx context.Context, r *http.Request, cs *consoleStream) {
	tick := time.NewTicker(s.Cfg.ConsoleEvery)
	defer tick.Stop()
	quiet := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-host.Draining(ctx):
			cs.send([]byte("event: bye\ndata: {\"reason\":\"the server is shutting down\"}\n\n"))
			return
		case <-tick.C:
		}
		again, refused := auth.Console(ctx, s.D.Store, r.Header.Get("Authorization"), s.Cell())
		if refused != nil {
			body, _ := json.Marshal(apierror.Body{Error: apierror.Detail{Code: refused.Code, Message: refused.Message}})
			cs.send([]byte("event: error\ndata: " + string(body) + "\n\n"))
			return
		}
		c, err := s.sharedSnapshot(ctx, again)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.D.Log.Warn("console: snapshot failed; the stream goes on", "err", err)
			continue
		}
		before := cs.seq
		if !cs.snapshot(c) {
			return
		}
		if cs.seq != before {
			quiet = time.Now()
		} else if time.Since(quiet) >= consoleHeartbeat {
			if !cs.send([]byte(": heartbeat\n\n")) {
				return
			}
			quiet = time.Now()
		}
	}
}

// consoleStream is one open console stream: where it writes, and the id
// and figures of the last snapshot it sent.
type consoleStream struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	seq  int
	last []byte
}

// startConsoleStream starts the answer of a console stream.
func startConsoleStream(w http.ResponseWriter) *consoleStream {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &consoleStream{w: w, rc: rc}
}

// send writes a frame. The server's write timeout bounds an answer; a
// stream is bounded per write instead, so a client that stops reading is
// let go.
func (cs *consoleStream) send(frame []byte) bool {
	_ = cs.rc.SetWriteDeadline(time.Now().Add(consoleHeartbeat))
	if _, err := cs.w.Write(frame); err != nil {
		return false
	}
	return cs.rc.Flush() == nil
}

// snapshot sends c, under the next id, when its figures changed since the
// last snapshot sent; false when the stream is over.
func (cs *consoleStream) snapshot(c *Console) bool {
	body, _ := json.Marshal(c)
	same := figures(c)
	if cs.last != nil && bytes.Equal(same, cs.last) {
		return true
	}
	cs.last, cs.seq = same, cs.seq+1
	return cs.send([]byte("id: " + strconv.Itoa(cs.seq) + "\nevent: snapshot\ndata: " + string(body) + "\n\n"))
}

// figures is what decides whether a snapshot changed: everything but the
// time it was read. While work is unfinished its age grows, so a stream
// then carries a snapshot every ConsoleEvery.
func figures(c *Console) []byte {
	cp := *c
	cp.At = time.Time{}
	b, _ := json.Marshal(cp)
	return b
}

// consolePage serves the console: one page, no resources from anywhere.
// It holds no figures itself and needs no credential; its script asks for
// a token and reads /v1/console/events with it.
func (s *Room) consolePage(w http.ResponseWriter, r *http.Request) {
	page.Console.Serve(w, r)
}

// consoleShared is the last snapshot read per scope (the cell, or one
// tenant), so that streams of one scope share its queries: a stream reads
// the database and the consumers again only when the scope's last snapshot
// is older than half of ConsoleEvery. GET /v1/console always reads afresh.
type consoleShared struct {
	mu   sync.Mutex
	last map[string]*Console
}
