package classifier

import (
	"context"
	"fmt"
	"sync"

	"assay.dev/pkg/admission"
)

// DefaultPartConcurrency is PartConcurrency unless set.
const DefaultPartConcurrency = 8

// maxPartConcurrency bounds PartConcurrency.
const maxPartConcurrency = 64

// partDefaults checks PartConcurrency, DefaultPartConcurrency unless set.
func (c *Config) partDefaults() error {
	switch {
	case c.PartConcurrency == 0:
		c.PartConcurrency = DefaultPartConcurrency
	case c.PartConcurrency < 1 || c.PartConcurrency > maxPartConcurrency:
		return fmt.Errorf("classifier: PartConcurrency (ASSAY_REVIEW_PART_CONCURRENCY) %d is not from 1 to %d", c.PartConcurrency, maxPartConcurrency)
	}
	return nil
}

// partSlots are the slots a review in parts calls on: at most
// PartConcurrency at once (one while its first call probes the model's
// circuit). The first is the lease's own permit, which the work took its
// turn for; each other is a permit of the cell's limiter, taken after the
// tenant's turn in the work's lane — a part is queued among the tenants as
// any message is — and given back when the part's calls end. A review
// that gets no more permits goes on with the lease's, one part at a time,
// so reviews in parts never wait on each other's permits.
type partSlots struct {
	s *Service
	r *partsRun
	// baseFree is whether the lease's permit is free, under r.mu.
	baseFree bool
	// extra brings the permits the acquirer took; want asks it for one.
	extra chan *admission.Permit
	want  chan struct{}
	// spare are permits taken and not yet used (the loop's alone).
	spare  []*admission.Permit
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// partSlot is one slot: the lease's permit (extra nil) or a permit of its
// own.
type partSlot struct{ extra *admission.Permit }

// newPartSlots starts the acquirer of r's permits beyond the lease's.
func (s *Service) newPartSlots(ctx context.Context, r *partsRun) *partSlots {
	sl := &partSlots{s: s, r: r, baseFree: true, extra: make(chan *admission.Permit), want: make(chan struct{}, 1)}
	ctx, sl.cancel = context.WithCancel(ctx)
	sl.done.Add(1)
	go sl.acquire(ctx)
	return sl
}

// acquire takes a permit each time one is wanted: the tenant's turn in the
// lane, then the cell's limiter.
func (sl *partSlots) acquire(ctx context.Context) {
	defer sl.done.Done()
	s, w := sl.s, sl.r.w
	for {
		select {
		case <-sl.want:
		case <-ctx.Done():
			return
		}
		turn, err := s.fair.lane(w.Lane).wait(ctx, w.TenantID, s.fair.weight(w.TenantID), sl.r.progress, s.cfg.AckWait/3)
		if err != nil {
			return
		}
		p, err := s.lim.Acquire(ctx, w.Lane)
		turn()
		if err != nil {
			return
		}
		s.fair.running(w.Lane).Add(1)
		select {
		case sl.extra <- p:
		case <-ctx.Done():
			sl.release(p, admission.Signal{Kind: admission.Ignore})
			return
		}
	}
}

// take takes a free slot, and when there is none while the review may
// run more calls, asks the acquirer for a permit (it comes on extra).
func (sl *partSlots) take() (partSlot, bool) {
	r := sl.r
	r.mu.Lock()
	defer r.mu.Unlock()
	bound := sl.s.cfg.PartConcurrency
	if r.probe {
		bound = 1
	}
	switch {
	case r.running >= bound:
		return partSlot{}, false
	case sl.baseFree:
		sl.baseFree = false
		return partSlot{}, true
	case len(sl.spare) > 0:
		p := sl.spare[len(sl.spare)-1]
		sl.spare = sl.spare[:len(sl.spare)-1]
		return partSlot{extra: p}, true
	}
	select {
	case sl.want <- struct{}{}:
	default:
	}
	return partSlot{}, false
}

// put gives a slot back once its part's calls ended; sig is what the last
// call tells the limiter.
func (sl *partSlots) put(slot partSlot, sig admission.Signal) {
	if slot.extra != nil {
		sl.release(slot.extra, sig)
		return
	}
	sl.r.mu.Lock()
	sl.baseFree = true
	sl.r.mu.Unlock()
}

func (sl *partSlots) release(p *admission.Permit, sig admission.Signal) {
	sl.s.fair.running(sl.r.w.Lane).Add(-1)
	p.Release(sig)
}

// close stops the acquirer and gives back the permits not used.
func (sl *partSlots) close() {
	sl.cancel()
	sl.done.Wait()
	for _, p := range sl.spare {
		sl.release(p, admission.Signal{Kind: admission.Ignore})
	}
	sl.spare = nil
}
