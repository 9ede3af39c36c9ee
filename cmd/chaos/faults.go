package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/event"
)

// Fault kinds the schedule can hold.
const (
	// SIGKILL a region's classifier after the provider answered (and
	// counted) one of its calls, before the answer reaches it.
	FaultClassifierAfterAnswer = "classifier-after-answer"
	// SIGKILL a classifier holding an answer, inside the transaction that
	// records the attempt and writes its events (held there on a lock on
	// its attempt row), so nothing it decided is published.
	FaultClassifierBeforePublish = "classifier-before-publish"
	// SIGKILL a committer that has validated an answer, inside the
	// transaction that commits it (held on a lock on results).
	FaultCommitterBeforeCommit = "committer-before-commit"
	// SIGKILL a service at a random moment.
	FaultKillIngress    = "kill-ingress"
	FaultKillClassifier = "kill-classifier"
	FaultKillCommitter  = "kill-committer"
	FaultKillLedger     = "kill-ledger"
	// SIGKILL nats-server and start it again on its store (intact).
	FaultNATSCrash = "nats-crash"
	// SIGTERM nats-server and start it again on its store.
	FaultNATSRestart = "nats-restart"
	// Freeze the committers and ledgers for 5s, SIGKILL nats-server, delete
	// its store, start it again: every stream, consumer and message is
	// gone, events acknowledged and not yet consumed among them. No
	// service recreates what it lost, so the harness then restarts them.
	FaultNATSStoreLost = "nats-store-lost"
	// Stop a region's classifier until a backlog builds, purge the region's
	// WORK stream (the broker loses every announcement), start it again:
	// only the sweeper can bring the backlog back.
	FaultPurgeWork = "purge-work"
	// Restart Postgres (immediate shutdown, a crash), throwaway cluster
	// only.
	FaultPGRestart = "pg-restart"
	// pg_terminate_backend every service connection.
	FaultPGTerminate = "pg-terminate"
	// The model stalls longer than the consumer's AckWait on one call, and
	// the work message is delivered again while that call still runs.
	FaultModelStall = "model-stall"
	// Schema-invalid and wrong-correlation answers from the provider.
	FaultModelInvalid = "model-invalid"
)

// DefaultFaults is the schedule of a full run: every kind, once.
var DefaultFaults = []string{
	FaultClassifierAfterAnswer, FaultClassifierBeforePublish, FaultCommitterBeforeCommit,
	FaultKillIngress, FaultKillClassifier, FaultKillCommitter, FaultKillLedger,
	FaultNATSCrash, FaultNATSRestart, FaultNATSStoreLost, FaultPurgeWork, FaultPGRestart,
	FaultPGTerminate, FaultModelStall, FaultModelInvalid,
}

// faultRecord is one scheduled fault and what happened when it ran.
type faultRecord struct {
	Kind   string
	Region string // "" for both cells
	At     time.Duration
	Fired  time.Time
	Done   time.Time
	Note   string
	Err    error
	Skip   string
	// Lost are work items the fault left for the sweeper or the lease to
	// recover; the report says when the last of them finished.
	Lost []string
	// Lasting faults hold for a while (a partition, a degraded link, a
	// failover until the old primary is back): recovery is measured from
	// their end, Done, not from when they fired.
	Lasting bool
}

// end is when recovery from the fault is measured from.
func (f *faultRecord) end() time.Time {
	if f.Lasting {
		return f.Done
	}
	return f.Fired
}

func (f *faultRecord) label() string {
	if f.Region == "" {
		return f.Kind
	}
	return f.Kind + "/" + f.Region
}

// schedule spreads the faults (each kind Options.Rounds times) over the
// load, in an order and at moments drawn from the seed, with regions
// drawn too.
func (h *Harness) schedule() []*faultRecord {
	var kinds []string
	for range max(1, h.o.Rounds) {
		kinds = append(kinds, h.o.Faults...)
	}
	h.rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	out := make([]*faultRecord, 0, len(kinds))
	if len(kinds) == 0 {
		return out
	}
	first, last := h.o.Load/20, h.o.Load*90/100
	step := (last - first) / time.Duration(max(1, len(kinds)-1))
	for i, k := range kinds {
		at := first + time.Duration(i)*step
		if step > 0 {
			at += time.Duration(h.rng.Int64N(int64(step/5)+1)) - step/10
		}
		f := &faultRecord{Kind: k, At: at, Lasting: slices.Contains(lastingFaults, k)}
		switch k {
		case FaultNATSCrash, FaultNATSRestart, FaultNATSStoreLost, FaultPGRestart, FaultPGTerminate, FaultModelInvalid:
		default:
			f.Region = config.DefaultRegions[h.rng.IntN(len(config.DefaultRegions))]
		}
		out = append(out, f)
	}
	return out
}

// inject runs the schedule against the clock of the load.
func (h *Harness) inject(ctx context.Context, t0 time.Time, sched []*faultRecord) {
	// Work an earlier fault stranded is that fault's to account for.
	stranded := map[string]bool{}
	for _, f := range sched {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(t0.Add(f.At))):
		}
		f.Fired = time.Now()
		h.logf("fault %s", f.label())
		f.Err = h.fire(ctx, f)
		f.Done = time.Now()
		own := f.Lost[:0]
		for _, id := range f.Lost {
			if !stranded[id] {
				stranded[id] = true
				own = append(own, id)
			}
		}
		f.Lost = own
		switch {
		case f.Skip != "":
			h.logf("fault %s skipped: %s", f.label(), f.Skip)
		case f.Err != nil:
			h.logf("fault %s FAILED: %v", f.label(), f.Err)
		default:
			h.logf("fault %s done in %s: %s", f.label(), f.Done.Sub(f.Fired).Round(time.Millisecond), f.Note)
		}
	}
}

func (h *Harness) fire(ctx context.Context, f *faultRecord) error {
	if h.cl != nil {
		if ok, err := h.fireCluster(ctx, f); ok {
			return err
		}
	}
	switch f.Kind {
	case FaultClassifierAfterAnswer:
		return h.killAfterAnswer(ctx, f)
	case FaultClassifierBeforePublish:
		return h.killBeforePublish(ctx, f)
	case FaultCommitterBeforeCommit:
		return h.killOnLock(ctx, f, "committer", "results")
	case FaultKillIngress, FaultKillClassifier, FaultKillCommitter, FaultKillLedger:
		names := h.instanceNames(strings.TrimPrefix(f.Kind, "kill-"), f.Region)
		return h.killRestart(ctx, f, names[h.rng.IntN(len(names))])
	case FaultNATSCrash:
		return h.restartNATS(ctx, f, true, false)
	case FaultNATSRestart:
		return h.restartNATS(ctx, f, false, false)
	case FaultNATSStoreLost:
		return h.restartNATS(ctx, f, true, true)
	case FaultPurgeWork:
		return h.purgeWork(ctx, f)
	case FaultPGRestart:
		if h.pg == nil {
			f.Skip = "Postgres is not the harness's own (ASSAY_DATABASE_URL set); a shared server is never restarted"
			return nil
		}
		if err := h.restartPostgres(ctx); err != nil {
			return err
		}
		f.Note = "pg_ctl restart -m immediate"
		return nil
	case FaultPGTerminate:
		return h.terminateBackends(ctx, f)
	case FaultModelStall:
		return h.modelStall(ctx, f)
	case FaultModelInvalid:
		return h.modelInvalid(f)
	}
	return fmt.Errorf("unknown fault %q", f.Kind)
}

// restartAfter starts a killed process again after a short, seeded pause
// and waits until it is ready.
func (h *Harness) restartAfter(ctx context.Context, p *proc) error {
	time.Sleep(500*time.Millisecond + time.Duration(h.rng.IntN(1500))*time.Millisecond)
	if err := p.start(); err != nil {
		return err
	}
	return p.waitReady(ctx, 60*time.Second)
}

func (h *Harness) killRestart(ctx context.Context, f *faultRecord, name string) error {
	p := h.procs[name]
	if err := p.kill(); err != nil {
		return err
	}
	f.Note = "SIGKILL " + name + ", restarted"
	return h.restartAfter(ctx, p)
}

func (h *Harness) killAfterAnswer(ctx context.Context, f *faultRecord) error {
	p := h.procs["classifier-"+f.Region]
	fired := make(chan string, 1)
	h.front.arm(f.Region, func(workID string) {
		_ = p.kill()
		fired <- workID
	})
	select {
	case w := <-fired:
		f.Note = "SIGKILL classifier-" + f.Region + " after the provider answered a call for " + w + ", restarted"
		f.Lost = []string{w}
	case <-time.After(30 * time.Second):
		h.front.disarm(f.Region)
		f.Skip = "no call from the region within 30s"
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.restartAfter(ctx, p)
}

// killOnLock holds an exclusive-enough lock on table in the region's
// database until one of service's connections waits on it, which pins that
// service inside the transaction that writes table, then SIGKILLs the
// service and lets the lock go: the transaction dies with its connection.
func (h *Harness) killOnLock(ctx context.Context, f *faultRecord, service, table string) error {
	name := service + "-" + f.Region
	conn, err := h.pool[f.Region].Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN SHARE MODE"); err != nil {
		return fmt.Errorf("lock %s: %w", table, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := h.pool[f.Region].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND query ILIKE '%' || $2 || '%'`,
			"chaos-"+name, table).Scan(&waiting); err != nil {
			return err
		}
		if waiting > 0 {
			f.Note = fmt.Sprintf("SIGKILL %s with %d transaction(s) waiting to write %s, restarted", name, waiting, table)
			break
		}
		if time.Now().After(deadline) {
			f.Skip = "no " + name + " transaction reached " + table + " within 20s"
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p := h.procs[name]
	if err := p.kill(); err != nil {
		return err
	}
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	return h.restartAfter(ctx, p)
}

// restartNATS stops nats-server (SIGKILL when crash, else SIGTERM) and
// starts it again, on its store or, when lose, on an empty one after
// freezing the consumers of ATTEMPT events (the committers and ledgers).
func (h *Harness) restartNATS(ctx context.Context, f *faultRecord, crash, lose bool) error {
	var frozen []*proc
	var err error
	if lose {
		if frozen, err = h.freezeConsumers(ctx, f); err != nil {
			return err
		}
	}
	defer func() {
		for _, p := range frozen {
			_ = p.resume()
		}
	}()
	if crash {
		err = h.nats.kill()
	} else {
		err = h.nats.stop()
	}
	if err != nil {
		return err
	}
	how := "SIGTERM"
	if crash {
		how = "SIGKILL"
	}
	f.Note = how + " nats-server, restarted on its store"
	if lose {
		if err := os.RemoveAll(h.natsStore); err != nil {
			return err
		}
		f.Note = how + " nats-server, store deleted, restarted empty"
	}
	time.Sleep(time.Second)
	if err := h.nats.start(); err != nil {
		return err
	}
	if err := h.nats.waitReady(ctx, 30*time.Second); err != nil || !lose {
		return err
	}
	for _, p := range frozen {
		if err := p.resume(); err != nil {
			return err
		}
	}
	if lose {
		f.Note += fmt.Sprintf(" (committers and ledgers frozen 5s before, %d work items unfinished)", len(f.Lost))
	}
	return h.awaitStreams(ctx, f)
}

// freezeConsumers pauses the committers and ledgers of every cell for a
// moment, so the store that is lost holds events the broker acknowledged
// and nobody consumed yet, and notes in f the work still unfinished.
func (h *Harness) freezeConsumers(ctx context.Context, f *faultRecord) ([]*proc, error) {
	var frozen []*proc
	for _, region := range config.DefaultRegions {
		for _, svc := range []string{"committer", "ledger"} {
			p := h.procs[svc+"-"+region]
			if err := p.pause(); err != nil {
				return nil, err
			}
			frozen = append(frozen, p)
		}
	}
	time.Sleep(5 * time.Second)
	for _, region := range config.DefaultRegions {
		rows, err := h.pool[region].Query(ctx, `SELECT id FROM work WHERE state IN ('queued', 'running')`)
		if err != nil {
			return nil, err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		f.Lost = append(f.Lost, ids...)
	}
	return frozen, nil
}

// awaitStreams waits for the cells to stand whole again after the server
// came back and notes in f how long that took. Nobody restarts the
// services: each stream's owner creates it again and each consumer its
// durable; invariant 6 measures throughput.
func (h *Harness) awaitStreams(ctx context.Context, f *faultRecord) error {
	healed := time.Now()
	deadline := healed.Add(2 * time.Minute)
	for {
		missing, err := h.natsMissing(ctx)
		if err != nil {
			return err
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			f.Note += "; after 2 min still missing: " + missing
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.Note += fmt.Sprintf("; no service restarted: every stream and durable was back %s after the server",
		time.Since(healed).Round(100*time.Millisecond))
	return nil
}

// natsMissing names the cells' streams and durables the broker does not
// have, "" when it has them all.
func (h *Harness) natsMissing(ctx context.Context) (string, error) {
	js, closeJS, err := h.jetStream(config.DefaultRegions[0])
	if err != nil {
		return "", err
	}
	defer closeJS()
	var missing []string
	for _, region := range config.DefaultRegions {
		n := event.Names{Cell: region}
		durables := map[string][]string{}
		for _, d := range n.Durables() {
			durables[d.Stream] = append(durables[d.Stream], d.Durable)
		}
		for _, k := range event.Kinds {
			if _, err := js.Stream(ctx, n.Stream(k)); err != nil {
				missing = append(missing, n.Stream(k))
				continue
			}
			for _, d := range durables[n.Stream(k)] {
				if _, err := js.Consumer(ctx, n.Stream(k), d); err != nil {
					missing = append(missing, n.Stream(k)+"/"+d)
				}
			}
		}
	}
	return strings.Join(missing, ", "), nil
}

// jetStream connects to the harness's nats-server (in the cluster mode,
// to the region's cluster) for one fault; the function closes the
// connection.
func (h *Harness) jetStream(region string) (jetstream.JetStream, func(), error) {
	u := h.natsURL
	if h.cl != nil {
		u = h.cl.cells[region].natsClusterURL()
	}
	nc, err := nats.Connect(u)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

func (h *Harness) purgeWork(ctx context.Context, f *faultRecord) error {
	p := h.procs["classifier-"+f.Region]
	if err := p.kill(); err != nil {
		return err
	}
	// Let announcements pile up unconsumed.
	time.Sleep(10 * time.Second)
	js, closeJS, err := h.jetStream(f.Region)
	if err != nil {
		return err
	}
	defer closeJS()
	st, err := js.Stream(ctx, (event.Names{Cell: f.Region}).Stream(event.KindWork))
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if err := st.Purge(ctx); err != nil {
		return err
	}
	rows, err := h.pool[f.Region].Query(ctx, `SELECT id FROM work WHERE state IN ('queued', 'running')`)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	f.Lost = ids
	f.Note = fmt.Sprintf("classifier-%s down 10s, then %d messages purged from %s with %d work items unfinished; classifier restarted",
		f.Region, info.State.Msgs, (event.Names{Cell: f.Region}).Stream(event.KindWork), len(ids))
	return h.restartAfter(ctx, p)
}

// killBeforePublish slows one call of the region, waits for its attempt,
// locks the attempt's row, and SIGKILLs the classifier once its answer is
// in hand and the transaction that records it (and writes its ATTEMPT
// event) waits on that lock.
func (h *Harness) killBeforePublish(ctx context.Context, f *faultRecord) error {
	name := "classifier-" + f.Region
	tenant := h.tenantOf(f.Region)
	if err := h.sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: tenant, Times: 1, Latency: 3 * time.Second}); err != nil {
		return err
	}
	var attempt, workID string
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := h.pool[f.Region].QueryRow(ctx, `SELECT a.id::text, a.work_id FROM attempts a JOIN work w ON w.id = a.work_id
			WHERE a.tenant_id = $1 AND a.outcome IS NULL AND w.lease_token = a.lease_token
				AND a.started_at < now() - interval '1 second' AND a.started_at > $2
			ORDER BY a.started_at DESC LIMIT 1`, tenant, f.Fired.Add(-time.Second)).Scan(&attempt, &workID)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Skip = "no slow call of " + tenant + " within 20s"
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := h.pool[f.Region].Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM attempts WHERE id = $1 FOR UPDATE`, attempt); err != nil {
		return err
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := h.pool[f.Region].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND query ILIKE '%attempts%'`,
			"chaos-"+name).Scan(&waiting); err != nil {
			return err
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			f.Skip = "the slow call's answer never reached the transaction that records it"
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p := h.procs[name]
	if err := p.kill(); err != nil {
		return err
	}
	f.Note = fmt.Sprintf("SIGKILL %s holding the answer for %s, its attempt not yet recorded nor published, restarted", name, workID)
	f.Lost = []string{workID}
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	return h.restartAfter(ctx, p)
}

// tenantOf is the first tenant homed in region.
func (h *Harness) tenantOf(region string) string {
	for _, t := range h.tenants {
		if t.Region == region {
			return t.ID
		}
	}
	return ""
}

func (h *Harness) terminateBackends(ctx context.Context, f *faultRecord) error {
	var n int
	names := make([]string, 0, len(h.dbName))
	for _, db := range h.dbName {
		names = append(names, db)
	}
	if err := h.pool[config.DefaultRegions[0]].QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name LIKE 'chaos-%' AND application_name <> 'chaos-harness' AND datname = ANY($1)`,
		names).Scan(&n); err != nil {
		return err
	}
	f.Note = fmt.Sprintf("terminated %d service backends", n)
	return nil
}

// modelStall makes the next call of a region hang longer than the
// classifier's AckWait and, while it hangs, delivers the
// work's announcement again, as JetStream does when an ack is overdue: the
// second delivery must stop at the claim fence.
func (h *Harness) modelStall(ctx context.Context, f *faultRecord) error {
	tenant := h.tenantOf(f.Region)
	stall := h.ackWait() + 5*time.Second
	if err := h.sim.AddFault(sim.Fault{Kind: sim.FaultLatency, Tenant: tenant, Times: 1, Latency: stall}); err != nil {
		return err
	}
	// Find the call that stalls: an attempt of that tenant begun since the
	// fault was set and still running 2s later.
	var workID string
	var dispatch int
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := h.pool[f.Region].QueryRow(ctx, `SELECT w.id, w.dispatch FROM work w JOIN attempts a ON a.work_id = w.id
			AND a.lease_token = w.lease_token WHERE w.state = 'running' AND w.tenant_id = $1 AND a.outcome IS NULL
				AND a.started_at < now() - interval '2 seconds' AND a.started_at > $2
			ORDER BY a.started_at LIMIT 1`, tenant, f.Fired.Add(-time.Second)).Scan(&workID, &dispatch)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Note = "stalled one call; could not find it to deliver its work again: " + err.Error()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	js, closeJS, err := h.jetStream(f.Region)
	if err != nil {
		return err
	}
	defer closeJS()
	lane := "interactive"
	_ = h.pool[f.Region].QueryRow(ctx, `SELECT lane FROM work WHERE id = $1`, workID).Scan(&lane)
	payload, _ := json.Marshal(event.Work{WorkID: workID, TenantID: tenant, Region: f.Region, Lane: lane, Dispatch: dispatch})
	if _, err := js.Publish(ctx, (event.Names{Cell: f.Region}).Work(lane, tenant), payload,
		jetstream.WithMsgID("chaos-redelivery-"+workID)); err != nil {
		return err
	}
	f.Note = fmt.Sprintf("call for %s stalls %s (AckWait %s); its announcement delivered again meanwhile", workID, stall, h.ackWait())
	f.Lost = []string{workID}
	return nil
}

func (h *Harness) modelInvalid(f *faultRecord) error {
	n := max(3, h.o.Items/200)
	kinds := []string{sim.FaultExtraProperty, sim.FaultBadEnum, sim.FaultWrongChangeID,
		sim.FaultWrongSchemaVersion, sim.FaultInvalidJSON, sim.FaultTruncated}
	for _, k := range kinds {
		if err := h.sim.AddFault(sim.Fault{Kind: k, Times: n}); err != nil {
			return err
		}
	}
	f.Note = fmt.Sprintf("%d calls each of %s", n, strings.Join(kinds, ", "))
	return nil
}
