package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// series is one instant-vector result: its labels and value.
type series struct {
	labels map[string]string
	value  float64
}

// vector runs an instant query and returns its series.
func vector(ctx context.Context, api, expr string) ([]series, error) {
	raw, err := query(ctx, api, expr)
	if err != nil {
		return nil, err
	}
	var out []series
	for _, r := range raw {
		var s struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, err
		}
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %v", expr, s.Value[1])
		}
		out = append(out, series{labels: s.Metric, value: v})
	}
	return out, nil
}

// keyed is a panel's or the database's answer: a value per label set (the
// labels named, joined), "" for a single value.
type keyed map[string]float64

func byLabels(ss []series, names ...string) keyed {
	out := keyed{}
	for _, s := range ss {
		var k []string
		for _, n := range names {
			k = append(k, s.labels[n])
		}
		out[strings.Join(k, "/")] += s.value
	}
	return out
}

func (k keyed) String() string {
	var ks []string
	for key := range k {
		ks = append(ks, key)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, key := range ks {
		fmt.Fprintf(&b, "%s=%g ", key, k[key])
	}
	return strings.TrimSpace(b.String())
}

// equalWithin: the same keys, each value within tol.
func (k keyed) equalWithin(o keyed, tol float64) bool {
	if len(k) != len(o) {
		return false
	}
	for key, v := range k {
		w, ok := o[key]
		if !ok || math.Abs(v-w) > tol {
			return false
		}
	}
	return true
}

// rateOf turns a panel's rates over five minutes into the counters they
// rate: in this run no service restarted, so each counter holds every
// event since the cell started, which is what the database holds.
var rateOf = regexp.MustCompile(`rate\(([a-z_:]+(?:\{[^}]*\})?)\[5m\]\)`)

func counters(expr string) string { return rateOf.ReplaceAllString(expr, "$1") }

// cellDB is what the test reads of each cell's database.
type cellDB map[string]*pgx.Conn

func openCells(t *testing.T, ctx context.Context, r Running) cellDB {
	t.Helper()
	out := cellDB{}
	for region, u := range r.Databases {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatalf("%s database: %v", region, err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		out[region] = c
	}
	return out
}

// rows runs sql on every cell and adds up what it returns: each row a key
// (its text columns, joined, after the region when perRegion) and a value
// (its last column).
func (db cellDB) rows(t *testing.T, ctx context.Context, perRegion bool, sql string) keyed {
	t.Helper()
	out := keyed{}
	for region, c := range db {
		rs, err := c.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %s: %v", region, sql, err)
		}
		for rs.Next() {
			vals, err := rs.Values()
			if err != nil {
				t.Fatal(err)
			}
			var k []string
			if perRegion {
				k = append(k, region)
			}
			for _, v := range vals[:len(vals)-1] {
				k = append(k, fmt.Sprint(v))
			}
			out[strings.Join(k, "/")] += toFloat(vals[len(vals)-1])
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case float64:
		return x
	case int32:
		return float64(x)
	}
	return math.NaN()
}

// eventually asks got and want until they agree, for up to 30 seconds (the
// gauges are sampled every second, scraped every second and recorded every
// second), and fails with the last of both.
func eventually(t *testing.T, what string, tol float64, got, want func() (keyed, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, gerr := got()
		w, werr := want()
		if gerr == nil && werr == nil && g.equalWithin(w, tol) {
			t.Logf("%s: %s, as the database", what, g)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: the panel says %s (%v), the database %s (%v)", what, g, gerr, w, werr)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// retryAfterProbe is the text of the one item the provider keeps
// answering 429 with a long Retry-After.
const retryAfterProbe = "retry-after-probe: please classify this once the provider lets us"

// holdOneItemBehindRetryAfter submits one interactive item that the
// provider answers 429 with a 150s Retry-After, waits until the classifier
// has put it back to wait that out, then sends ten more items of the same
// lane through, and returns the first one's id. The ten are delivered and
// acknowledged past the held one, which keeps the durable's ack floor
// below them.
func holdOneItemBehindRetryAfter(t *testing.T, ctx context.Context, r Running, db cellDB) string {
	t.Helper()
	if err := r.Sim.AddFault(sim.Fault{Kind: sim.FaultRateLimit, Match: "retry-after-probe", RetryAfter: 150 * time.Second}); err != nil {
		t.Fatal(err)
	}
	id := submitModeration(t, ctx, r, 0, retryAfterProbe)
	waitRow(t, ctx, db["us"], `SELECT count(*) FROM attempts WHERE work_id = $1 AND outcome = 'rate_limited'`, id)
	var ids []string
	for i := range 10 {
		ids = append(ids, submitModeration(t, ctx, r, i+1, fmt.Sprintf("after the probe, item %d: the order arrived on time", i)))
	}
	for _, f := range ids {
		waitRow(t, ctx, db["us"], `SELECT count(*) FROM work WHERE id = $1 AND state NOT IN ('queued', 'running')`, f)
	}
	return id
}

// submitModeration posts one interactive moderation item to the us cell,
// through its ingress replicas in turn, and returns its work id.
func submitModeration(t *testing.T, ctx context.Context, r Running, n int, text string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"contract": "moderation", "sourceId": fmt.Sprintf("watch/probe#%d", n),
		"revision": "r1", "input": map[string]string{"text": text}})
	base := r.Ingress["us"][n%len(r.Ingress["us"])]
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/work", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.Tokens["us"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		WorkID string `json:"workId"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /v1/work: %s %v", resp.Status, err)
	}
	return out.WorkID
}

// waitRow waits up to a minute for sql (one id argument) to count a row.
func waitRow(t *testing.T, ctx context.Context, c *pgx.Conn, sql, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := c.QueryRow(ctx, sql, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no row for %s within a minute", sql, id)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkLagWhileRetryAfter: with one item waiting out a long Retry-After
// and ten acknowledged behind it, the durable's ack floor is stuck below
// delivered messages — the distance that the old lag counted — yet the
// lag panel reads 0 for every durable: nothing waits to be delivered.
func checkLagWhileRetryAfter(t *testing.T, ctx context.Context, api string, r Running, boards []dashboard) {
	t.Helper()
	nc, err := nats.Connect(r.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	names := event.Names{Installation: event.DefaultInstallation, Cell: "us"}
	c, err := js.Consumer(ctx, names.Stream(event.KindWork), names.WorkConsumer(event.Interactive))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gap := info.Delivered.Stream - info.AckFloor.Stream; gap == 0 || info.NumAckPending == 0 {
		t.Fatalf("the held item is not holding the ack floor (delivered %d, ack floor %d, ack pending %d): the check shows nothing",
			info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending)
	} else {
		t.Logf("held: the ack floor is %d messages below what the durable delivered, %d pending, %d ack pending", gap, info.NumPending, info.NumAckPending)
	}
	lag := panelExpr(t, boards, "jetstream.json", "Lag: messages not delivered yet", "A")
	// The durables are sampled every 5s, scraped and recorded every second,
	// each step on a loaded machine late by as much as it likes. So the
	// test waits for what it needs, within the hold's 150s: every sampler
	// of the held lane's durable last sampled it holding the item (ack
	// pending), then the panel, recorded after that, reads 0 for every
	// durable, and then the item is still held.
	deadline := time.Now().Add(90 * time.Second)
	held := fmt.Sprintf(`min(assay_jetstream_consumer_ack_pending{stream=%q, consumer=%q}) > 0`,
		names.Stream(event.KindWork), names.WorkConsumer(event.Interactive))
	for {
		got, err := vector(ctx, api, held)
		if err == nil && len(got) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v %v: Prometheus never saw the held item", held, got, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	since := float64(time.Now().UnixMilli()) / 1000
	recorded := fmt.Sprintf(`(%s) and on() (min(timestamp(%s)) > %.3f)`, lag, lag, since)
	var got []series
	for {
		var err error
		got, err = vector(ctx, api, recorded)
		zero := err == nil && len(got) > 0
		for _, s := range got {
			zero = zero && s.value == 0
		}
		if zero {
			break
		}
		if time.Now().After(deadline) {
			for _, s := range got {
				t.Errorf("the lag panel reads %g for %s on %s while one item waits out its Retry-After", s.value, s.labels["consumer"], s.labels["region"])
			}
			t.Fatalf("%s: %v (%d series)", recorded, err, len(got))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if info, err := c.Info(ctx); err != nil || info.Delivered.Stream == info.AckFloor.Stream || info.NumAckPending == 0 {
		t.Fatalf("the item was no longer held when the panel read 0 (%v): the check shows nothing", err)
	}
	t.Logf("lag panel: %d durables, all 0", len(got))
}

// panelExpr is the PromQL of one panel's target, with $region and $cell as
// every region and every cell.
func panelExpr(t *testing.T, boards []dashboard, file, title, ref string) string {
	t.Helper()
	for _, b := range boards {
		for _, p := range b.Panels {
			for _, tg := range p.Targets {
				if b.file == file && p.Title == title && tg.RefID == ref {
					return strings.NewReplacer("$region", ".*", "$cell", ".*").Replace(tg.Expr)
				}
			}
		}
	}
	t.Fatalf("%s has no panel %q target %s", file, title, ref)
	return ""
}

// checkOverviewEqualsDatabase asks every panel of the overview what it
// shows and the cells' databases what is true, and requires them to
// agree. Panels over rates are asked over the counters they rate (no
// service restarted in this run, so a counter holds everything since the
// start, as the database does).
func checkOverviewEqualsDatabase(t *testing.T, ctx context.Context, api string, r Running, boards []dashboard, rules ruleSet, db cellDB) {
	t.Helper()
	prom := func(expr string, labels ...string) func() (keyed, error) {
		return func() (keyed, error) {
			ss, err := vector(ctx, api, expr)
			return byLabels(ss, labels...), err
		}
	}
	views := func() (keyed, error) {
		out := keyed{}
		for region, u := range r.Databases {
			st, err := store.Open(ctx, u)
			if err != nil {
				return nil, err
			}
			v, err := st.Views(ctx, 24*time.Hour)
			st.Close()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", region, err)
			}
			for k, n := range v {
				out[k] += float64(n)
			}
		}
		return out, nil
	}
	for _, p := range []struct{ title, view string }{{"Running", "running"}, {"Accepted", "accepted"},
		{"Ready for human review", "needs_review"}, {"Validation-rejected", "rejected"}, {"Terminal", "terminal"}} {
		eventually(t, "overview / "+p.title, 0, prom(panelExpr(t, boards, "overview.json", p.title, "A")), func() (keyed, error) {
			v, err := views()
			return keyed{"": v[p.view]}, err
		})
	}
	eventually(t, "overview / Work by state", 0, prom(panelExpr(t, boards, "overview.json", "Work by state", "A"), "view"), views)

	ended := `SELECT state, count(*) FROM work WHERE state NOT IN ('queued', 'running') GROUP BY 1`
	eventually(t, "overview / Outcomes (counted)", 0,
		prom(counters(panelExpr(t, boards, "overview.json", "Outcomes per second", "A")), "outcome"),
		func() (keyed, error) { return db.rows(t, ctx, false, ended), nil })

	missed := rules.expr(t, "assay:deadline_missed:ratio5m")
	eventually(t, "overview / Missed deadlines (over the counters)", 1e-9, prom(counters(missed), "region"), func() (keyed, error) {
		out := keyed{}
		n := db.rows(t, ctx, true, `SELECT count(*) FILTER (WHERE state IN ('expired', 'retry_exhausted'))::float8 / count(*)
			FROM work WHERE state NOT IN ('queued', 'running') HAVING count(*) > 0`)
		for k, v := range n {
			out[k] = v
		}
		return out, nil
	})

	eventually(t, "overview / Oldest unfinished work", 5, prom(panelExpr(t, boards, "overview.json", "Oldest unfinished work", "A"), "region", "lane"),
		func() (keyed, error) {
			out := keyed{}
			for region := range db {
				for _, lane := range event.Lanes {
					out[region+"/"+lane] = 0
				}
			}
			for k, v := range db.rows(t, ctx, true, `SELECT lane, extract(epoch FROM now() - min(created_at))::float8
				FROM work WHERE state IN ('queued', 'running') GROUP BY 1`) {
				out[k] = v
			}
			return out, nil
		})

	outbox := func(col string) func() (keyed, error) {
		return func() (keyed, error) {
			out := keyed{}
			for region := range db {
				for _, s := range event.Kinds {
					out[region+"/"+s] = 0
				}
			}
			for k, v := range db.rows(t, ctx, true, `SELECT stream, count(*) FILTER (WHERE `+col+`) FROM outbox_waiting
				WHERE stream <> 'OUTCOME' GROUP BY 1`) {
				out[k] = v
			}
			return out, nil
		}
	}
	eventually(t, "overview / Outbox backlog (pending)", 0, prom(panelExpr(t, boards, "overview.json", "Outbox backlog", "A"), "region", "stream"),
		outbox("set_aside_at IS NULL"))
	eventually(t, "overview / Outbox backlog (set aside)", 0, prom(panelExpr(t, boards, "overview.json", "Outbox backlog", "B"), "region", "stream"),
		outbox("set_aside_at IS NOT NULL"))

	checkEndToEndQuantiles(t, ctx, api, boards, db)
}

// checkEndToEndQuantiles: the end-to-end panel's p50 and p95 per lane, over
// the whole run, fall in the histogram bucket that holds the database's own
// quantile of created-to-ended times (give or take 50 ms, the difference
// between the committer's clock and the row's timestamps).
func checkEndToEndQuantiles(t *testing.T, ctx context.Context, api string, boards []dashboard, db cellDB) {
	t.Helper()
	durations := map[string][]float64{}
	for _, c := range db {
		rs, err := c.Query(ctx, `SELECT lane, extract(epoch FROM updated_at - created_at)::float8 FROM work WHERE state NOT IN ('queued', 'running')`)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var lane string
			var d float64
			if err := rs.Scan(&lane, &d); err != nil {
				t.Fatal(err)
			}
			durations[lane] = append(durations[lane], d)
		}
		rs.Close()
	}
	bounds := append(slices.Clone(telemetry.LatencyBuckets), math.Inf(1))
	bucket := func(v float64) (lo, hi float64) {
		i, _ := slices.BinarySearch(bounds, v)
		if i > 0 {
			lo = bounds[i-1]
		}
		return lo, bounds[i]
	}
	for ref, q := range map[string]float64{"A": 0.5, "B": 0.95} {
		got, err := vector(ctx, api, counters(panelExpr(t, boards, "overview.json", "End to end, p50 and p95", ref)))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range got {
			ds := slices.Sorted(slices.Values(durations[s.labels["lane"]]))
			if len(ds) == 0 {
				t.Errorf("end to end p%g: a %s series, but no ended %s work in the database", q*100, s.labels["lane"], s.labels["lane"])
				continue
			}
			want := ds[max(0, int(math.Ceil(q*float64(len(ds))))-1)]
			// The panel's clock reads an ending after its commit returns,
			// the database's at the commit's start: on a loaded machine
			// the panel's may fall a bucket above, never below.
			lo, _ := bucket(want - 0.05)
			_, up := bucket(want + 0.05)
			_, hi := bucket(math.Nextafter(up, math.Inf(1)))
			if s.value < lo || s.value > hi {
				t.Errorf("end to end p%g %s: the panel says %.3fs; the database's is %.3fs, in (%g, %g]", q*100, s.labels["lane"], s.value, want, lo, hi)
			} else {
				t.Logf("end to end p%g %s: panel %.3fs, database %.3fs (%d endings)", q*100, s.labels["lane"], s.value, want, len(ds))
			}
		}
	}
}
