package classifier

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// fairShare serves the tenants waiting in one lane in turn, by weight
// (start-time fair queuing): each waiting message is tagged with a virtual
// start time, the later of the lane's virtual time and the end of its
// tenant's previous message, which lasts 1/weight; the message with the
// smallest tag goes next to the limiter, one at a time per lane. A tenant
// that offers ten times its share queues behind its own messages, not in
// front of everyone else's, and a tenant that was idle starts at the
// lane's present, with no credit saved up.
//
// It orders the messages this instance holds: the lane's durable delivers
// in stream order into a hand of Limit()+FairWindow messages, and the turn
// is taken among those. Ingress keeps an interactive backlog to about a
// second of service, so the window sees all of it.
type fairShare struct {
	mu      sync.Mutex
	vtime   float64
	finish  map[string]float64 // tenant -> virtual end of its last message
	held    map[string]int     // tenant -> messages waiting for their turn
	waiting waiters
	turn    bool // a message has the lane's turn: it waits at the limiter
	seq     uint64
}

type fairWaiter struct {
	tenant string
	start  float64
	seq    uint64
	ready  chan struct{}
	index  int // in waiting; -1 once given the turn
}

func newFairShare() *fairShare {
	return &fairShare{finish: map[string]float64{}, held: map[string]int{}}
}

// wait waits for the tenant's message's turn in the lane and returns what
// gives the turn back (once the message has its permit, or gave up). While
// it waits it calls keepAlive every keepEvery, so the message's ack wait
// does not run out in the queue.
func (f *fairShare) wait(ctx context.Context, tenant string, weight int, keepAlive func(), keepEvery time.Duration) (done func(), err error) {
	if weight < 1 {
		weight = 1
	}
	f.mu.Lock()
	start := max(f.vtime, f.finish[tenant])
	f.finish[tenant] = start + 1/float64(weight)
	f.seq++
	w := &fairWaiter{tenant: tenant, start: start, seq: f.seq, ready: make(chan struct{})}
	heap.Push(&f.waiting, w)
	f.held[tenant]++
	f.dispatchLocked()
	f.mu.Unlock()

	var tick <-chan time.Time
	if keepAlive != nil && keepEvery > 0 {
		t := time.NewTicker(keepEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-w.ready:
			var once sync.Once
			return func() { once.Do(f.release) }, nil
		case <-tick:
			keepAlive()
		case <-ctx.Done():
			f.mu.Lock()
			if w.index < 0 {
				// Given the turn as ctx ended: pass it on.
				f.turn = false
				f.dispatchLocked()
			} else {
				heap.Remove(&f.waiting, w.index)
				f.leftLocked(tenant)
			}
			f.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

func (f *fairShare) release() {
	f.mu.Lock()
	f.turn = false
	f.dispatchLocked()
	f.mu.Unlock()
}

// dispatchLocked gives the turn to the message with the smallest tag when
// no message has it.
func (f *fairShare) dispatchLocked() {
	if f.turn || f.waiting.Len() == 0 {
		return
	}
	w := heap.Pop(&f.waiting).(*fairWaiter)
	f.vtime = max(f.vtime, w.start)
	f.turn = true
	f.leftLocked(w.tenant)
	close(w.ready)
}

// leftLocked counts a message of tenant out of the queue, and forgets
// tenants that wait for nothing and owe nothing, so the maps stay as small
// as the set of tenants waiting.
func (f *fairShare) leftLocked(tenant string) {
	if f.held[tenant]--; f.held[tenant] <= 0 {
		delete(f.held, tenant)
	}
	if len(f.finish) > 2*len(f.held)+64 {
		for t, end := range f.finish {
			if f.held[t] == 0 && end <= f.vtime {
				delete(f.finish, t)
			}
		}
	}
}

// snapshot is the tenants waiting and their counts.
func (f *fairShare) snapshot() (total int, byTenant map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	byTenant = make(map[string]int, len(f.held))
	for t, n := range f.held {
		byTenant[t] = n
		total += n
	}
	return total, byTenant
}

type waiters []*fairWaiter

func (q waiters) Len() int { return len(q) }
func (q waiters) Less(i, j int) bool {
	if q[i].start != q[j].start {
		return q[i].start < q[j].start
	}
	return q[i].seq < q[j].seq
}
func (q waiters) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *waiters) Push(x any) {
	w := x.(*fairWaiter)
	w.index = len(*q)
	*q = append(*q, w)
}
func (q *waiters) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	w.index = -1
	return w
}

// fairLanes are a fairShare per lane and the tenants' weights.
type fairLanes struct {
	lanes   map[string]*fairShare
	weights atomic.Pointer[map[string]int] // tenants whose weight is not 1
	served  atomic.Int64                   // permits released with an answer
	inLane  [2]atomic.Int64                // permits held, interactive and batch

	mu       sync.Mutex
	minWait  [2]time.Duration            // by lane, since the last report
	minWaitT [2]map[string]time.Duration // by lane and tenant, the same
}

func laneIdx(lane string) int {
	if lane == event.Interactive {
		return 0
	}
	return 1
}

// waited records the queue wait of work that got its permit.
func (f *fairLanes) waited(lane, tenant string, d time.Duration) {
	d = max(d, time.Microsecond)
	i := laneIdx(lane)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.minWait[i] == 0 || d < f.minWait[i] {
		f.minWait[i] = d
	}
	if f.minWaitT[i] == nil {
		f.minWaitT[i] = map[string]time.Duration{}
	}
	if cur, ok := f.minWaitT[i][tenant]; !ok || d < cur {
		f.minWaitT[i][tenant] = d
	}
}

// takeWaits returns the lane's shortest waits since the last call and
// starts over.
func (f *fairLanes) takeWaits(lane string) (time.Duration, map[string]time.Duration) {
	i := laneIdx(lane)
	f.mu.Lock()
	defer f.mu.Unlock()
	m, t := f.minWait[i], f.minWaitT[i]
	f.minWait[i], f.minWaitT[i] = 0, nil
	return m, t
}

func (f *fairLanes) running(lane string) *atomic.Int64 { return &f.inLane[laneIdx(lane)] }

func newFairLanes() *fairLanes {
	f := &fairLanes{lanes: map[string]*fairShare{}}
	for _, lane := range event.Lanes {
		f.lanes[lane] = newFairShare()
	}
	empty := map[string]int{}
	f.weights.Store(&empty)
	return f
}

func (f *fairLanes) lane(lane string) *fairShare {
	if q, ok := f.lanes[lane]; ok {
		return q
	}
	return f.lanes[event.Batch]
}

func (f *fairLanes) weight(tenant string) int {
	if w, ok := (*f.weights.Load())[tenant]; ok {
		return w
	}
	return 1
}

// acquire takes the work's turn among its lane's tenants, then a permit
// from the cell's limiter.
func (s *Service) acquire(ctx context.Context, w *store.Work, d consumer.Delivery) (*servedPermit, error) {
	done, err := s.fair.lane(w.Lane).wait(ctx, w.TenantID, s.fair.weight(w.TenantID), func() { _ = d.InProgress() }, s.cfg.AckWait/3)
	if err != nil {
		return nil, err
	}
	// The cell's slots may all be held by other instances: the message is
	// kept alive while it waits for one, as in the turn's queue.
	stop := keepAlive(func() { _ = d.InProgress() }, s.cfg.AckWait/3)
	p, err := s.lim.Acquire(ctx, w.Lane)
	stop()
	done()
	if err != nil {
		return nil, err
	}
	// The wait counts from when the work could run: its last change (its
	// creation, or its requeue after an attempt) or the retry it was
	// parked for, whichever is later. Time spent parked on purpose is not
	// a queue.
	eligible := w.UpdatedAt
	if w.RetryAt.After(eligible) {
		eligible = w.RetryAt
	}
	if !eligible.IsZero() {
		s.fair.waited(w.Lane, w.TenantID, max(time.Since(eligible), 0))
	}
	run := s.fair.running(w.Lane)
	run.Add(1)
	return &servedPermit{p: p, served: &s.fair.served, running: run}, nil
}

// servedPermit is a limiter permit that counts the answers it was
// released with: the cell's service rate, reported to ingress.
type servedPermit struct {
	p        *admission.Permit
	served   *atomic.Int64
	running  *atomic.Int64
	released atomic.Bool
}

// Release releases the permit; only the first call has an effect.
func (p *servedPermit) Release(s admission.Signal) {
	if p.released.Swap(true) {
		return
	}
	p.running.Add(-1)
	if s.Kind == admission.Success {
		p.served.Add(1)
	}
	p.p.Release(s)
}

// stillInTime checks the work's deadline again once it has its turn and
// its permit: the wait for them may have spent what the call needed, and a
// call that cannot answer in time is not made.
func (s *Service) stillInTime(ctx context.Context, ev event.Work, w *store.Work, need time.Duration) (consumer.Disposition, bool) {
	if st := admit(ev, w, time.Now(), need, s.cfg.MaxAttempts, true); !st.proceed {
		return s.carry(ctx, w.ID, w, st), false
	}
	return consumer.Disposition{}, true
}
