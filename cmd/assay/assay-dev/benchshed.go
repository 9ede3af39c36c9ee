package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/admission"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/outcome"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// benchShed prints scenario 6's figures against its targets (from the rows
// already run) and runs scenarios 7 (a noisy tenant beside steady ones) and
// 8 (two ingress instances, one tenant rate), each with its contrast.
func benchShed(ctx context.Context, base string, want map[int]bool, scale float64, logw io.Writer, rows []benchResult, stdout io.Writer) error {
	d := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	var six []benchResult
	for _, r := range rows {
		if r.Scenario == "6" {
			six = append(six, r)
		}
	}
	if len(six) > 0 {
		printShedTable(stdout, six)
	}
	if want[7] {
		var fr []fairResult
		for _, phase := range []string{"together", "alone"} {
			fmt.Fprintf(os.Stderr, "bench: scenario 7 (noisy tenant at 10x its share beside three steady), %s…\n", phase)
			r, err := runFairBench(ctx, base, phase, d(30), logw)
			if err != nil {
				return fmt.Errorf("scenario 7 %s: %w", phase, err)
			}
			fr = append(fr, r...)
		}
		printFairTable(stdout, fr)
	}
	if want[9] {
		var ar []attackResult
		for _, phase := range []string{"alone", "attacked", "limited"} {
			fmt.Fprintf(os.Stderr, "bench: scenario 9 (a steady tenant beside an invalid-batch flood), %s…\n", phase)
			r, err := runAttackBench(ctx, base, phase, d(20), logw)
			if err != nil {
				return fmt.Errorf("scenario 9 %s: %w", phase, err)
			}
			ar = append(ar, r)
		}
		printAttackTable(stdout, ar)
	}
	if want[8] {
		var rr []rateResult
		for _, mode := range []string{"shared", "local"} {
			fmt.Fprintf(os.Stderr, "bench: scenario 8 (two ingress instances, one tenant rate), %s…\n", mode)
			r, err := runRateBench(ctx, base, mode, d(20), logw)
			if err != nil {
				return fmt.Errorf("scenario 8 %s: %w", mode, err)
			}
			rr = append(rr, r)
		}
		printRateTable(stdout, rr)
	}
	return nil
}

func printShedTable(w io.Writer, rs []benchResult) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | ingress | goodput / capacity (≥ 95 %) | served interactive queue wait p50 / p95 ms (p95 ≤ 1000) | admitted then expired (≤ 1 %) | provider 429s / calls (≤ 2 %) | refused at ingress (429) | admitted / offered |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		admitted := 0
		for _, n := range r.Outcomes {
			admitted += n
		}
		mode := "shed"
		if r.Mode == "unshed" {
			mode = "queue (ASSAY_SHED=off)"
		}
		fmt.Fprintf(w, "| 6 | %s | %.1f / %.1f = %s | %s / %s | %d / %d = %s | %d / %d = %s | %d | %d / %d |\n",
			mode, r.Goodput, r.Capacity, pct(r.Goodput, r.Capacity), ms(r.QueueP50["interactive"]), ms(r.QueueP95["interactive"]),
			r.Outcomes[outcome.Expired], admitted, pct(float64(r.Outcomes[outcome.Expired]), float64(admitted)),
			r.Throttled, r.Calls, pct(float64(r.Throttled), float64(r.Calls)), r.IngressRefused, admitted, r.Offered)
	}
}

// offerCounts are the answers an offered load got.
type offerCounts struct {
	offered, admitted, refused, failed atomic.Int64
}

// offerTo submits at rate per second for d to url as the token's tenant,
// open loop, and counts the answers.
func offerTo(ctx context.Context, client *http.Client, url, token string, rate float64, d time.Duration, lane string,
	mk func(int) ingress.SubmitRequest, c *offerCounts) error {
	return openLoop(ctx, rate, d, func(i int) {
		req := mk(i)
		req.Lane = lane
		c.offered.Add(1)
		body, _ := json.Marshal(req)
		hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/work", bytes.NewReader(body))
		hr.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(hr)
		if err != nil {
			c.failed.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted, http.StatusOK:
			c.admitted.Add(1)
		case http.StatusTooManyRequests:
			c.refused.Add(1)
		default:
			c.failed.Add(1)
		}
	})
}

func moderationOf(prefix string) func(int) ingress.SubmitRequest {
	return (&benchRun{}).moderation(prefix)
}

func benchClient() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}}
}

// quiesce waits until no work is queued or running, at most two minutes.
func quiesce(ctx context.Context, b *benchBed) (int, error) {
	end := time.Now().Add(2 * time.Minute)
	for {
		n, err := countQ(ctx, b.db, `SELECT count(*) FROM work WHERE state IN ('queued', 'running')`)
		if err != nil || n == 0 || time.Now().After(end) {
			return n, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fairResult is one tenant's figures in one phase of scenario 7.
type fairResult struct {
	Phase, Tenant                 string
	Rate                          float64 // offered per second
	Offered, Refused              int64
	Accepted, Expired             int
	QueueP50, QueueP95            time.Duration
	Calls, Throttled, InFlightEnd int
}

// runFairBench is scenario 7: the provider serves 100 req/s; four tenants
// of weight 1 share it, 25/s each. Together: "noisy" offers 250/s (ten
// times its share) and steady-1..3 offer 15/s each. Alone: steady-1 offers
// its 15/s by itself.
func runFairBench(ctx context.Context, base, phase string, load time.Duration, logw io.Writer) ([]fairResult, error) {
	tenants := []string{"noisy", "steady-1", "steady-2", "steady-3"}
	rates := map[string]float64{"noisy": 250, "steady-1": 15, "steady-2": 15, "steady-3": 15}
	if phase == "alone" {
		tenants = []string{"steady-1"}
	}
	bed, err := startBenchBed(ctx, base, cell.Options{
		Log:        benchLogger(logw, 7, phase),
		Classifier: classifier.Config{Concurrency: 32, CallTimeout: 10 * time.Second},
		Ingress:    ingress.Config{InteractiveDeadline: 8 * time.Second, SweepEvery: time.Second, LeaseGrace: 2 * time.Second},
	}, tenants)
	if err != nil {
		return nil, err
	}
	defer bed.close()
	if err := bed.sim.SetCapacity(sim.Capacity{Rate: 100, Burst: 10, Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 100 * time.Millisecond}}); err != nil {
		return nil, err
	}
	client := benchClient()
	warmFair(ctx, client, bed, tenants, rates)
	sampled := sampleLanes(ctx, bed)
	counts := map[string]*offerCounts{}
	var wg sync.WaitGroup
	errs := make(chan error, len(tenants))
	for _, t := range tenants {
		counts[t] = &offerCounts{}
		wg.Go(func() {
			errs <- offerTo(ctx, client, bed.cell.URL, bed.tokens[t], rates[t], load, "interactive", moderationOf("s7-"+t), counts[t])
		})
	}
	wg.Wait()
	lanes := sampled()
	close(errs)
	for err := range errs {
		if err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "  %s lane, sampled every 250ms from the classifiers' reports: undelivered max %d, held max %d (the hand holds the limit plus 128)\n",
		phase, lanes.undelivered, lanes.held)
	inFlight, err := quiesce(ctx, bed)
	if err != nil {
		return nil, err
	}
	if err := printFairPath(ctx, bed, phase); err != nil {
		return nil, err
	}
	return fairResults(ctx, bed, phase, rates, counts, inFlight)
}

// warmFair offers every tenant's work at its rate or its share, whichever
// is less, for five seconds, so the measured window starts on a cell whose
// limit, latency and rate are learned (a cold cell's limit starts at 4 and
// grows). Its work is left out of the figures.
func warmFair(ctx context.Context, client *http.Client, bed *benchBed, tenants []string, rates map[string]float64) {
	var warm sync.WaitGroup
	for _, t := range tenants {
		warm.Go(func() {
			_ = offerTo(ctx, client, bed.cell.URL, bed.tokens[t], min(rates[t], 25), 5*time.Second, "interactive", moderationOf("w7-"+t), &offerCounts{})
		})
	}
	warm.Wait()
}

// fairResults reads each tenant's figures of phase from the cell's work
// and attempts, the provider's counts, and what was offered.
func fairResults(ctx context.Context, bed *benchBed, phase string, rates map[string]float64, counts map[string]*offerCounts, inFlight int) ([]fairResult, error) {
	st := bed.sim.Stats()
	var out []fairResult
	rows, err := bed.db.Query(ctx, `SELECT w.tenant_id,
			count(*) FILTER (WHERE w.state = 'accepted'), count(*) FILTER (WHERE w.state = 'expired'),
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at)), 0),
			coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at)), 0)
		FROM work w LEFT JOIN (SELECT work_id, min(started_at) AS first FROM attempts GROUP BY work_id) a ON a.work_id = w.id
		WHERE w.source_id LIKE 's7-%'
		GROUP BY w.tenant_id ORDER BY w.tenant_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var r fairResult
		var p50, p95 float64
		if err := rows.Scan(&r.Tenant, &r.Accepted, &r.Expired, &p50, &p95); err != nil {
			return nil, err
		}
		r.Phase, r.Rate = phase, rates[r.Tenant]
		r.QueueP50, r.QueueP95 = time.Duration(p50*float64(time.Second)), time.Duration(p95*float64(time.Second))
		if c := counts[r.Tenant]; c != nil {
			r.Offered, r.Refused = c.offered.Load(), c.refused.Load()
		}
		r.Calls, r.InFlightEnd = int(st.Total), inFlight
		r.Throttled = int(st.Throttled)
		for _, ts := range st.Tenants {
			r.Throttled += int(ts.RateLimited)
		}
		out = append(out, r)
		fmt.Fprintf(os.Stderr, "  %s %s: offered %d, refused %d, accepted %d, expired %d, queue wait p50 %v p95 %v\n",
			phase, r.Tenant, r.Offered, r.Refused, r.Accepted, r.Expired, r.QueueP50.Round(time.Millisecond), r.QueueP95.Round(time.Millisecond))
	}
	return out, rows.Err()
}

// laneSample is the most the interactive lane held at one look.
type laneSample struct{ undelivered, held int }

// sampleLanes reads the classifiers' capacity reports every 250ms until
// the function it returns is called, which returns the most seen.
func sampleLanes(ctx context.Context, bed *benchBed) func() laneSample {
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan laneSample, 1)
	go func() {
		var most laneSample
		defer func() { done <- most }()
		kv, err := bed.cell.Env.JS.KeyValue(sctx, bed.cell.Env.Config.Names().CapacityBucket())
		if err != nil {
			return
		}
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			keys, err := kv.Keys(sctx)
			if err != nil {
				continue
			}
			var now laneSample
			for _, k := range keys {
				e, err := kv.Get(sctx, k)
				if err != nil {
					continue
				}
				var r admission.CapacityReport
				if json.Unmarshal(e.Value(), &r) == nil {
					l := r.Lanes["interactive"]
					now.undelivered = max(now.undelivered, l.Undelivered)
					now.held += l.Held
				}
			}
			most.undelivered, most.held = max(most.undelivered, now.undelivered), max(most.held, now.held)
		}
	}()
	return func() laneSample { cancel(); return <-done }
}

// printFairPath prints how long each tenant's work waited from its
// creation to its first attempt's start (the announcement, the stream, the
// classifier's hand, the turn and the permit, the claim).
func printFairPath(ctx context.Context, bed *benchBed, phase string) error {
	rows, err := bed.db.Query(ctx, `SELECT w.tenant_id,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at)),
			percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.first - w.created_at))
		FROM work w
		JOIN (SELECT work_id, min(started_at) AS first FROM attempts GROUP BY work_id) a ON a.work_id = w.id
		WHERE w.source_id LIKE 's7-%'
		GROUP BY w.tenant_id ORDER BY w.tenant_id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var p50, p95 float64
		if err := rows.Scan(&t, &p50, &p95); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "  %s %s path: created → first attempt p50 %.0f p95 %.0f ms\n", phase, t, p50*1000, p95*1000)
	}
	return rows.Err()
}

func printFairTable(w io.Writer, rs []fairResult) {
	alone := map[string]time.Duration{}
	for _, r := range rs {
		if r.Phase == "alone" {
			alone[r.Tenant] = r.QueueP95
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | run | tenant | offered /s | offered | refused (429) | accepted / offered (steady ≥ 95 %) | expired | queue wait p50 / p95 ms | p95 / alone p95 (steady ≤ 1.5×) | in flight at end |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		ratio := "–"
		if a := alone["steady-1"]; a > 0 && r.Tenant != "noisy" {
			ratio = fmt.Sprintf("%.2f×", float64(r.QueueP95)/float64(a))
		}
		fmt.Fprintf(w, "| 7 | %s | %s | %.0f | %d | %d | %d / %d = %s | %d | %s / %s | %s | %d |\n",
			r.Phase, r.Tenant, r.Rate, r.Offered, r.Refused, r.Accepted, r.Offered, pct(float64(r.Accepted), float64(r.Offered)),
			r.Expired, ms(r.QueueP50), ms(r.QueueP95), ratio, r.InFlightEnd)
	}
}

// rateResult is one run of scenario 8.
type rateResult struct {
	Mode                       string
	Configured                 float64 // per second
	Offered, Admitted, Refused int64
	Stored                     int
	Window                     time.Duration
	PerInstanceAdmitted        [2]int64
}

// runRateBench is scenario 8: tenant acme may submit 3,000 a minute (50/s,
// burst 10) per lane; two ingress instances of the cell each get 50/s of
// its interactive work for the load (twice its rate together). shared:
// the instances take from the cell's shared buckets (the default); local:
// each keeps its own (ASSAY_INGRESS_RATE=local).
func runRateBench(ctx context.Context, base, mode string, load time.Duration, logw io.Writer) (rateResult, error) {
	res := rateResult{Mode: mode, Configured: 50}
	icfg := ingress.Config{InteractiveDeadline: 8 * time.Second, SweepEvery: time.Second, LeaseGrace: 2 * time.Second,
		Shed: ingress.ShedConfig{LocalRate: mode == "local", Off: true}}
	bed, err := startBenchBed(ctx, base, cell.Options{
		Log:        benchLogger(logw, 8, mode),
		Classifier: classifier.Config{Concurrency: 32, CallTimeout: 10 * time.Second},
		Ingress:    icfg,
	}, []string{"acme"})
	if err != nil {
		return res, err
	}
	defer bed.close()
	if err := bed.sim.SetCapacity(sim.Capacity{Rate: 200, Burst: 20, Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 100 * time.Millisecond}}); err != nil {
		return res, err
	}
	if err := bed.cell.Env.Store.SetRate(ctx, "acme", 3000, 10); err != nil {
		return res, err
	}
	// The second instance: the same cell, its own relay, sweeper and
	// listener.
	env := bed.cell.Env
	icfg.Region, icfg.Names, icfg.Streams = env.Config.Region, env.Config.Names(), env.Config.Streams
	second, err := ingress.New(icfg, ingress.Deps{Store: env.Store, JS: env.JS, Contracts: env.Contracts,
		Log: env.Log.With("service", "ingress-2"), Tel: env.Tel})
	if err != nil {
		return res, err
	}
	if err := second.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		second.Stop(sctx)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: second.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	urls := []string{bed.cell.URL, "http://" + ln.Addr().String()}

	client := benchClient()
	var counts [2]offerCounts
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, u := range urls {
		wg.Go(func() {
			errs <- offerTo(ctx, client, u, bed.tokens["acme"], 50, load, "interactive", moderationOf(fmt.Sprintf("s8-%d", i)), &counts[i])
		})
	}
	wg.Wait()
	res.Window = time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			return res, err
		}
	}
	for i := range counts {
		res.Offered += counts[i].offered.Load()
		res.Admitted += counts[i].admitted.Load()
		res.Refused += counts[i].refused.Load()
		res.PerInstanceAdmitted[i] = counts[i].admitted.Load()
	}
	if _, err := quiesce(ctx, bed); err != nil {
		return res, err
	}
	if res.Stored, err = countQ(ctx, bed.db, `SELECT count(*) FROM work WHERE tenant_id = 'acme'`); err != nil {
		return res, err
	}
	fmt.Fprintf(os.Stderr, "  %s: offered %d, admitted %d (%d + %d), refused %d, stored %d over %.1f s\n", mode, res.Offered,
		res.Admitted, res.PerInstanceAdmitted[0], res.PerInstanceAdmitted[1], res.Refused, res.Stored, res.Window.Seconds())
	return res, nil
}

func printRateTable(w io.Writer, rs []rateResult) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | tenant rate | configured /s | offered /s (2 instances) | admitted /s (instance 1 + 2) | admitted / configured (≤ 1.1×) | refused (429) | stored |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		secs := r.Window.Seconds()
		mode := "shared (NATS KV)"
		if r.Mode == "local" {
			mode = "per instance (ASSAY_INGRESS_RATE=local)"
		}
		fmt.Fprintf(w, "| 8 | %s | %.0f | %.1f | %.1f (%.1f + %.1f) | %.2f× | %d | %d |\n", mode, r.Configured,
			float64(r.Offered)/secs, float64(r.Stored)/secs, float64(r.PerInstanceAdmitted[0])/secs, float64(r.PerInstanceAdmitted[1])/secs,
			float64(r.Stored)/secs/r.Configured, r.Refused, r.Stored)
	}
}
