package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
)

// Faults only a cluster has (-cluster).
const (
	// Cut one NATS node of a cell — the leader of one of the cell's
	// streams — from its two peers, for Options.FaultFor, then heal. Its
	// clients stay connected to it.
	FaultNATSPartition = "nats-partition"
	// Cut one service process from every NATS node of its cell, its
	// Postgres links intact, for Options.FaultFor.
	FaultServiceNATSPartition = "service-nats-partition"
	// Cut one service process from both Postgres hosts, its NATS links
	// intact, for Options.FaultFor.
	FaultServicePGPartition = "service-pg-partition"
	// SIGKILL the node leading one of a cell's streams the moment a
	// publish to it has landed (publishes are in flight), and start it
	// again on its store a few seconds later.
	FaultKillStreamLeader = "kill-stream-leader"
	// SIGKILL the node leading one of a cell's durable consumers the
	// moment an ack has moved its floor, and start it again.
	FaultKillConsumerLeader = "kill-consumer-leader"
	// SIGKILL a cell's Postgres primary, promote its standby (pg_ctl
	// promote), and rejoin the old primary as the new one's standby
	// (pg_rewind, else a fresh base backup). Writes wait for the standby,
	// as in production, until it is back.
	FaultPGFailover = "pg-failover"
	// Add latency on a link for Options.FaultFor: every link of one
	// service process, or one NATS node's routes.
	FaultLinkLatency = "link-latency"
	// Packet loss on a link for Options.FaultFor, chosen as for latency.
	FaultLinkLoss = "link-loss"
)

// ClusterFaults is the schedule of a full -cluster run: each cluster
// fault once.
var ClusterFaults = []string{
	FaultNATSPartition, FaultServiceNATSPartition, FaultServicePGPartition, FaultKillStreamLeader,
	FaultKillConsumerLeader, FaultPGFailover, FaultLinkLatency, FaultLinkLoss,
}

// lastingFaults hold for a while; recovery is measured from their end.
var lastingFaults = []string{FaultNATSPartition, FaultServiceNATSPartition, FaultServicePGPartition,
	FaultPGFailover, FaultLinkLatency, FaultLinkLoss}

// clusterAlso are the single-server faults that also run in the cluster
// mode (on one process of the service, drawn from the seed).
var clusterAlso = []string{FaultKillIngress, FaultKillClassifier, FaultKillCommitter, FaultKillLedger, FaultModelInvalid}

// streamDurables are a cell's streams with the durable consumer that
// reads each.
func streamDurables(n event.Names) [][2]string {
	return [][2]string{
		{n.Stream(event.KindWork), n.WorkConsumer(event.Interactive)},
		{n.Stream(event.KindAttempt), n.ResultConsumer()},
		{n.Stream(event.KindAttempt), n.AttemptConsumer()},
		{n.Stream(event.KindOutcome), n.OutcomeConsumer()},
	}
}

// fireCluster runs one fault of the cluster mode; ok is false for a kind
// it does not know.
func (h *Harness) fireCluster(ctx context.Context, f *faultRecord) (bool, error) {
	switch f.Kind {
	case FaultNATSPartition:
		return true, h.natsPartition(ctx, f)
	case FaultServiceNATSPartition, FaultServicePGPartition:
		return true, h.servicePartition(ctx, f)
	case FaultKillStreamLeader:
		return true, h.killLeader(ctx, f, false)
	case FaultKillConsumerLeader:
		return true, h.killLeader(ctx, f, true)
	case FaultPGFailover:
		return true, h.pgFailover(ctx, f)
	case FaultLinkLatency, FaultLinkLoss:
		return true, h.degradeLink(ctx, f)
	}
	return false, nil
}

// faultFor is how long a partition or a degraded link lasts: FaultFor,
// give or take a quarter, from the seed.
func (h *Harness) faultFor() time.Duration {
	d := h.o.FaultFor
	return d*3/4 + time.Duration(h.rng.Int64N(int64(d/2)+1))
}

// hold keeps a fault on for d, or until the run is canceled.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (c *cellCluster) natsNames() []string {
	var out []string
	for _, n := range c.nats {
		out = append(out, n.name)
	}
	return out
}

func (c *cellCluster) pgNames() []string { return []string{c.pg[0].name, c.pg[1].name} }

func (c *cellCluster) node(name string) *natsNode {
	for _, n := range c.nats {
		if n.name == name {
			return n
		}
	}
	return nil
}

// leaderOf names the node leading a stream, or with a durable, that
// consumer.
func (h *Harness) leaderOf(ctx context.Context, region, stream, durable string) (string, error) {
	js, closeJS, err := h.jetStream(region)
	if err != nil {
		return "", err
	}
	defer closeJS()
	var ci *jetstream.ClusterInfo
	if durable == "" {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return "", err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return "", err
		}
		ci = info.Cluster
	} else {
		cons, err := js.Consumer(ctx, stream, durable)
		if err != nil {
			return "", err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return "", err
		}
		ci = info.Cluster
	}
	if ci == nil || ci.Leader == "" {
		return "", fmt.Errorf("%s %s has no leader", stream, durable)
	}
	return ci.Leader, nil
}

func (h *Harness) natsPartition(ctx context.Context, f *faultRecord) error {
	c := h.cl.cells[f.Region]
	sd := streamDurables(event.Names{Cell: f.Region})
	stream := sd[h.rng.IntN(len(sd))][0]
	leader, err := h.leaderOf(ctx, f.Region, stream, "")
	if err != nil {
		return err
	}
	var peers []string
	for _, n := range c.natsNames() {
		if n != leader {
			peers = append(peers, n)
		}
	}
	ls := h.cl.links.between([]string{leader}, peers)
	d := h.faultFor()
	setLinks(ls, linkState{Cut: true})
	hold(ctx, d)
	setLinks(ls, linkState{})
	f.Note = fmt.Sprintf("%s (leader of %s) cut from %s for %s (%d route links); its clients stayed on it",
		leader, stream, strings.Join(peers, " and "), d.Round(100*time.Millisecond), len(ls))
	return nil
}

// servicePartition cuts one process of a service from NATS or from
// Postgres.
func (h *Harness) servicePartition(ctx context.Context, f *faultRecord) error {
	c := h.cl.cells[f.Region]
	svc := services[h.rng.IntN(len(services))]
	names := h.instanceNames(svc, f.Region)
	name := names[h.rng.IntN(len(names))]
	what, far := "NATS (every node)", c.natsNames()
	if f.Kind == FaultServicePGPartition {
		what, far = "Postgres (both hosts)", c.pgNames()
	}
	ls := h.cl.links.between([]string{name}, far)
	if len(ls) == 0 {
		return fmt.Errorf("no links from %s to %s", name, what)
	}
	d := h.faultFor()
	setLinks(ls, linkState{Cut: true})
	hold(ctx, d)
	setLinks(ls, linkState{})
	f.Note = fmt.Sprintf("%s cut from %s for %s, its other links intact", name, what, d.Round(100*time.Millisecond))
	return nil
}

// degradeLink slows a link, or makes it lose packets, for a while: every
// link of one service process, or one NATS node's routes.
func (h *Harness) degradeLink(ctx context.Context, f *faultRecord) error {
	c := h.cl.cells[f.Region]
	var ls []*link
	var which string
	if h.rng.IntN(3) == 0 {
		n := c.nats[h.rng.IntN(len(c.nats))].name
		var peers []string
		for _, p := range c.natsNames() {
			if p != n {
				peers = append(peers, p)
			}
		}
		ls, which = h.cl.links.between([]string{n}, peers), n+"'s routes"
	} else {
		svc := services[h.rng.IntN(len(services))]
		names := h.instanceNames(svc, f.Region)
		name := names[h.rng.IntN(len(names))]
		ls, which = h.cl.links.between([]string{name}, append(c.natsNames(), c.pgNames()...)), "every link of "+name
	}
	st := linkState{}
	how := ""
	if f.Kind == FaultLinkLatency {
		st.Delay = time.Duration(100+h.rng.IntN(201)) * time.Millisecond
		how = fmt.Sprintf("%s latency each way", st.Delay)
	} else {
		st.Loss = float64(5+h.rng.IntN(16)) / 100
		st.Delay = 2 * time.Millisecond
		how = fmt.Sprintf("%.0f%% packet loss", st.Loss*100)
	}
	d := h.faultFor()
	setLinks(ls, st)
	hold(ctx, d)
	setLinks(ls, linkState{})
	f.Note = fmt.Sprintf("%s on %s (%d links) for %s", how, which, len(ls), d.Round(100*time.Millisecond))
	return nil
}

// killLeader SIGKILLs the node leading one of the cell's streams (or its
// consumer) the moment the stream took a publish (or the consumer an
// ack), and starts it again on its store after a short pause.
func (h *Harness) killLeader(ctx context.Context, f *faultRecord, consumer bool) error {
	c := h.cl.cells[f.Region]
	sd := streamDurables(event.Names{Cell: f.Region})
	pick := sd[h.rng.IntN(len(sd))]
	stream, durable := pick[0], ""
	if consumer {
		durable = pick[1]
	}
	leader, err := h.leaderOf(ctx, f.Region, stream, durable)
	if err != nil {
		return err
	}
	n := c.node(leader)
	if n == nil {
		return fmt.Errorf("leader %q is no node of cell %s", leader, f.Region)
	}
	what := "a publish to " + stream
	if consumer {
		what = "an ack to " + stream + "/" + durable
	}
	moved, err := h.waitProgress(ctx, f.Region, stream, durable, 20*time.Second)
	if err != nil {
		return err
	}
	if !moved {
		f.Skip = "no " + what + " within 20s"
		return nil
	}
	if err := n.proc.kill(); err != nil {
		return err
	}
	pause := 2*time.Second + time.Duration(h.rng.IntN(3000))*time.Millisecond
	hold(ctx, pause)
	if err := n.proc.start(); err != nil {
		return err
	}
	if err := n.proc.waitReady(ctx, 90*time.Second); err != nil {
		return err
	}
	now, err := h.leaderOf(ctx, f.Region, stream, durable)
	if err != nil {
		now = "not known (" + err.Error() + ")"
	}
	f.Note = fmt.Sprintf("SIGKILL %s, leader of %s, right after %s landed; restarted on its store %s later; leader now %s",
		leader, orDurable(stream, durable), what, pause.Round(100*time.Millisecond), now)
	return nil
}

// waitProgress waits until a stream takes a publish (its last sequence
// moves) or, with a durable, until an ack moves the consumer's floor, and
// says whether one came within d.
func (h *Harness) waitProgress(ctx context.Context, region, stream, durable string, d time.Duration) (bool, error) {
	js, closeJS, err := h.jetStream(region)
	if err != nil {
		return false, err
	}
	defer closeJS()
	mark := func() (uint64, error) {
		if durable != "" {
			cons, err := js.Consumer(ctx, stream, durable)
			if err != nil {
				return 0, err
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return 0, err
			}
			return info.AckFloor.Consumer, nil
		}
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return 0, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	before, err := mark()
	if err != nil {
		return false, err
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if now, err := mark(); err == nil && now > before {
			return true, nil
		}
	}
	return false, nil
}

func orDurable(stream, durable string) string {
	if durable == "" {
		return stream
	}
	return stream + "/" + durable
}

// pgFailover kills the primary, promotes the standby, and rejoins the old
// primary as the new primary's standby. It measures how long the cell
// could not commit: from the kill until a write through the multi-host
// URL commits, which, with the standby required, waits for the rejoin.
func (h *Harness) pgFailover(ctx context.Context, f *faultRecord) error {
	c := h.cl.cells[f.Region]
	old, nw := c.pg[c.primary], c.pg[1-c.primary]
	wrote := make(chan time.Time, 1)
	pctx, cancelProbe := context.WithCancel(ctx)
	defer cancelProbe()
	if err := old.proc.kill(); err != nil {
		return err
	}
	killed := time.Now()
	go func() { wrote <- h.probeWrite(pctx, f.Region) }()
	// An operator (or the operator) notices and promotes.
	hold(ctx, time.Second+time.Duration(h.rng.IntN(2000))*time.Millisecond)
	if out, err := h.pgRun(ctx, nw.dir, "pg_ctl", "promote", "-w", "-t", "60", "-D", nw.data()); err != nil {
		return fmt.Errorf("pg_ctl promote %s: %w\n%s", nw.name, err, out)
	}
	promoted := time.Now()
	c.primary = 1 - c.primary
	// The promoted server writes its new timeline to its control file at
	// its next checkpoint; pg_rewind reads it there, and before it would
	// find nothing to rewind.
	if err := h.pgExec(ctx, nw, "CHECKPOINT"); err != nil {
		return err
	}
	how, err := h.rejoin(ctx, c, old, nw, false)
	if err != nil {
		return err
	}
	var w time.Time
	select {
	case w = <-wrote:
	case <-time.After(30 * time.Second):
		// The rejoined standby does not confirm commits: build it afresh.
		_ = old.proc.kill()
		how += "; it never confirmed a commit, so a fresh base backup"
		if _, err := h.rejoin(ctx, c, old, nw, true); err != nil {
			return err
		}
		select {
		case w = <-wrote:
		case <-time.After(60 * time.Second):
			return errors.New("no write committed 60s after the old primary rejoined from a fresh base backup")
		}
	}
	f.Note = fmt.Sprintf("SIGKILL primary %s; %s promoted %s later; %s rejoined as its standby (%s) %s after the kill; writes committed again %s after the kill",
		old.name, nw.name, promoted.Sub(killed).Round(100*time.Millisecond), old.name, how,
		time.Since(killed).Round(100*time.Millisecond), w.Sub(killed).Round(100*time.Millisecond))
	return nil
}

// rejoin makes the old primary a standby of the new one — with pg_rewind
// (which first runs the crash recovery a killed server needs), or when
// that fails or fresh is set, a new base backup — starts it, and waits
// until it streams.
func (h *Harness) rejoin(ctx context.Context, c *cellCluster, old, nw *pgNode, fresh bool) (string, error) {
	how := "pg_rewind"
	src := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres", nw.port)
	out, err := []byte(nil), error(nil)
	if !fresh {
		out, err = h.pgRun(ctx, old.dir, "pg_rewind", "-D", old.data(), "--source-server", src, "--no-sync")
	}
	if fresh || err != nil {
		how = "a fresh base backup"
		if err != nil {
			how = "pg_rewind failed (" + lastLine(out) + "), a fresh base backup"
		}
		if err := h.buildStandby(ctx, c, old, nw); err != nil {
			return "", err
		}
	} else {
		// pg_rewind copied the new primary's configuration: the old one's
		// port and standby settings go back on top.
		if err := appendFile(filepath.Join(old.data(), "postgresql.conf"), pgConf(c, old)); err != nil {
			return "", err
		}
		if err := h.standbyOf(old, nw); err != nil {
			return "", err
		}
	}
	if err := h.startPG(ctx, old); err != nil {
		return "", err
	}
	return how, h.waitStandby(ctx, c, old, 2*time.Minute)
}

// pgExec runs one statement on a server, direct.
func (h *Harness) pgExec(ctx context.Context, n *pgNode, sql string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, pgURL("postgres", n.port))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(cctx, sql)
	return err
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// probeWrite commits a row in the cell's database through the harness's
// multi-host pool, every 100ms until one commits, and says when.
func (h *Harness) probeWrite(ctx context.Context, region string) time.Time {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := h.pool[region].Exec(cctx, `INSERT INTO chaos_probe DEFAULT VALUES`)
		cancel()
		if err == nil {
			return time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}
}

// createProbe makes the table probeWrite writes.
func createProbe(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `CREATE TABLE chaos_probe (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// failoverCheck is invariant f: work ingress acknowledged before a
// primary was killed is all there after the standby took over, each with
// its outcome (the standby had every commit the primary acknowledged).
func (h *Harness) failoverCheck(works map[string]*workRow, subs []*submission, sched []*faultRecord) check {
	var parts, bad []string
	ok := true
	for _, f := range sched {
		if f.Kind != FaultPGFailover || f.Fired.IsZero() || f.Err != nil {
			continue
		}
		before, kept := 0, 0
		for _, s := range subs {
			if !s.Acked || !s.AckedAt.Before(f.Fired) || s.Tenant.Region != f.Region {
				continue
			}
			for id := range s.WorkIDs {
				before++
				if w := works[id]; w != nil && outcome.IsTerminal(w.State) {
					kept++
				} else {
					bad = append(bad, f.label()+": "+id+" acknowledged before the kill, missing or unfinished after")
				}
			}
		}
		ok = ok && kept == before
		parts = append(parts, fmt.Sprintf("%s: %d of %d", f.label(), kept, before))
	}
	if len(parts) == 0 {
		parts = append(parts, "no failover ran")
	}
	return check{N: "f", What: "work acknowledged before a Postgres primary was killed is there, with its outcome, after the standby took over",
		Figure: strings.Join(parts, "; "), OK: ok, Offenders: bad}
}
