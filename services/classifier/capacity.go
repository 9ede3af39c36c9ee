package classifier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/event"
)

// weightSource is the store's view of the tenants' fair-share weights.
type weightSource interface {
	Weights(ctx context.Context) (map[string]int, error)
}

// capacityReporter tells ingress, through the cell's capacity bucket, how
// fast this instance serves and what waits in each lane, every
// ReportEvery. It also reloads the tenants' weights now and then.
type capacityReporter struct {
	s        *Service
	instance string
	kv       jetstream.KeyValue

	lastServed  int64
	lastAt      time.Time
	rate        float64 // answers per second, smoothed from zero
	since       time.Time
	weightsAt   time.Time
	weightsFrom weightSource
}

// rateTau is the time constant of the smoothed service rate: long enough
// to ride over a second without answers, short enough to follow a
// provider that halves.
const rateTau = 2 * time.Second

func newInstanceID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pass reloads the weights when they are due, and reports the cell's
// capacity as this instance sees it.
func (r *capacityReporter) pass(ctx context.Context) (bool, error) {
	now := time.Now()
	r.reloadWeights(ctx, now)
	rate := r.observeRate(now)
	rep := r.report(ctx, now, rate)
	return false, r.put(ctx, rep)
}

// reloadWeights reads the tenants' weights again once WeightsEvery has
// passed since the last read.
func (r *capacityReporter) reloadWeights(ctx context.Context, now time.Time) {
	s := r.s
	if now.Sub(r.weightsAt) < s.cfg.WeightsEvery {
		return
	}
	r.weightsAt = now
	if w, err := r.weightsFrom.Weights(ctx); err != nil {
		s.d.Log.Warn("tenant weights not reloaded", "err", err)
	} else {
		s.fair.weights.Store(&w)
	}
}

// observeRate folds the answers served since the last pass into the
// smoothed rate, and is the rate to report: none while it is too young.
func (r *capacityReporter) observeRate(now time.Time) float64 {
	served := r.s.fair.served.Load()
	if !r.lastAt.IsZero() {
		r.rate = smoothRate(r.rate, served-r.lastServed, now.Sub(r.lastAt))
	}
	r.lastServed, r.lastAt = served, now
	// The smoothed rate starts at zero and says little until it has run
	// for a few of its time constants: until then no rate is reported, and
	// ingress counts on what the limit could serve. A cell that just
	// started (its limit growing from 4, its R3 streams electing leaders)
	// serves little for a while; taken as its service rate, that refused
	// everyone for seconds.
	if r.since.IsZero() {
		r.since = now
	}
	if now.Sub(r.since) < 3*rateTau {
		return 0
	}
	return r.rate
}

// smoothRate is rate moved toward the rate of n answers in dt, with the
// time constant rateTau; rate itself when no time passed.
func smoothRate(rate float64, n int64, dt time.Duration) float64 {
	if dt <= 0 {
		return rate
	}
	inst := float64(n) / dt.Seconds()
	a := 1 - math.Exp(-float64(dt)/float64(rateTau))
	return rate + a*(inst-rate)
}

// report is the capacity report of this instance at now: its limiter's
// figures, what waits in each lane and in the committer's consumer.
func (r *capacityReporter) report(ctx context.Context, now time.Time, rate float64) admission.CapacityReport {
	s := r.s
	st := s.lim.Stats()
	rep := admission.CapacityReport{Instance: r.instance, At: now, Every: s.cfg.ReportEvery, Rate: rate,
		Limit: st.Limit, InFlight: st.InFlight, Latency: st.Short, Lanes: map[string]admission.LaneLoad{}}
	// Before the first answer the latency is unknown: a second is
	// assumed, so a fresh cell admits a little, learns, and admits more.
	lat := time.Second
	if st.Short > 0 {
		lat = st.Short
	}
	rep.Potential = float64(st.Limit) / lat.Seconds()
	stream := s.cfg.Names.Stream(event.KindWork)
	for _, lane := range lanes {
		rep.Lanes[lane] = s.laneLoad(ctx, stream, lane)
	}
	// The committer's backlog: the attempts' results, and any a classifier
	// of an earlier release published on their own.
	for _, kind := range []string{event.KindAttempt, event.KindResult} {
		if c, err := s.d.JS.Consumer(ctx, s.cfg.Names.Stream(kind), s.cfg.Names.ResultConsumer()); err == nil {
			if info, err := c.Info(ctx); err == nil {
				rep.Downstream += int(info.NumPending) + info.NumAckPending
			}
		}
	}
	return rep
}

// laneLoad is what waits in a lane: undelivered in its consumer, held and
// running here, by tenant.
func (s *Service) laneLoad(ctx context.Context, stream, lane string) admission.LaneLoad {
	var l admission.LaneLoad
	if c, err := s.d.JS.Consumer(ctx, stream, Consumer(s.cfg.Names, lane)); err == nil {
		if info, err := c.Info(ctx); err == nil {
			l.Undelivered = int(info.NumPending)
		}
	}
	held, by := s.fair.lane(lane).snapshot()
	l.Held, l.Running = held, int(s.fair.running(lane).Load())
	minWait, waits := s.fair.takeWaits(lane)
	l.MinWait = minWait
	if len(by)+len(waits) > 0 {
		l.Tenants = make(map[string]admission.TenantLoad, len(by)+len(waits))
		for t, n := range by {
			l.Tenants[t] = admission.TenantLoad{Held: n, Weight: s.fair.weight(t), MinWait: waits[t]}
		}
		for t, d := range waits {
			if _, ok := l.Tenants[t]; !ok {
				l.Tenants[t] = admission.TenantLoad{Weight: s.fair.weight(t), MinWait: d}
			}
		}
	}
	return l
}

// put writes rep to the cell's capacity bucket, creating the bucket when
// this reporter has none yet or it went.
func (r *capacityReporter) put(ctx context.Context, rep admission.CapacityReport) error {
	s := r.s
	if r.kv == nil {
		// At the cell's replicas and placement: the reports ingress
		// admits on outlive the loss of one NATS node. One try a pass:
		// the next pass asks again.
		kv, err := event.EnsureBucket(ctx, s.d.JS, s.d.Log, jetstream.KeyValueConfig{Bucket: s.cfg.Names.CapacityBucket(),
			Description: "the cell's capacity, reported by its classifier instances for ingress admission",
			History:     1, TTL: time.Minute, Storage: jetstream.MemoryStorage}, s.cfg.Streams.Once())
		if err != nil {
			return fmt.Errorf("capacity bucket: %w", err)
		}
		r.kv = kv
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, "classifier."+r.instance, b); err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			r.kv = nil // created again on the next pass
		}
		return fmt.Errorf("capacity report: %w", err)
	}
	return nil
}

// startReporter sets up the capacity reporter, a lifecycle part started
// with the lanes' consumers.
func (s *Service) startReporter() {
	r := &capacityReporter{s: s, instance: newInstanceID()}
	r.weightsFrom = s.d.Store
	t := &s.report
	t.Name, t.Log, t.PassTimeout = "capacity", s.d.Log, 5*time.Second
	t.Every = s.cfg.ReportEvery
	if t.Every < 0 {
		t.Every = time.Hour
		t.Pass = func(context.Context) (bool, error) { return false, nil }
		return
	}
	t.Pass = r.pass
}
