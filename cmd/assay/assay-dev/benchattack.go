package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// attackResult is one phase of scenario 9.
type attackResult struct {
	Phase string
	// Steady tenant: its submissions and their answer times.
	Steady        int
	P50, P99, Max time.Duration
	// Attacker: requests sent and what they got, by status.
	Attacks  int
	ByStatus map[int]int
	// CPU is the cell process's CPU time over the phase.
	CPU    time.Duration
	Window time.Duration
}

// runAttackBench is scenario 9: tenant acme submits work at 20/s, open
// loop, and its answer times are measured; in the attacked and limited
// phases tenant mallory meanwhile sends a 3.5 MB batch of 200,000 keys no
// request has, sixteen at once (curl processes), every half second:
// within its rate (attacked), or over it (limited, one a minute). The attacker is a
// process of its own, so the cell's CPU time (this process's) counts
// what refusing its requests cost, not what sending them did.
func runAttackBench(ctx context.Context, base, phase string, load time.Duration, logw io.Writer) (attackResult, error) {
	res := attackResult{Phase: phase, ByStatus: map[int]int{}}
	curl, err := exec.LookPath("curl")
	if err != nil {
		return res, fmt.Errorf("scenario 9 sends its attack with curl: %w", err)
	}
	bed, err := startBenchBed(ctx, base, cell.Options{
		Log:        benchLogger(logw, 9, phase),
		Classifier: classifier.Config{Concurrency: 32, CallTimeout: 10 * time.Second},
		Ingress:    ingress.Config{InteractiveDeadline: 8 * time.Second},
	}, []string{"acme", "mallory"})
	if err != nil {
		return res, err
	}
	defer bed.close()
	if err := attackLimits(ctx, bed, phase); err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "assay-attack-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	body := filepath.Join(dir, "batch.json")
	if err := os.WriteFile(body, attackBatch(), 0o600); err != nil {
		return res, err
	}

	// A warm-up, so the cell's first calls (its consumers made, its
	// latency learned) are not in the figures.
	// A cold cell may refuse a first submission for capacity while it
	// learns: the warm-up's answers are not counted.
	_, _ = steadyLatencies(ctx, bed, 3*time.Second, "s9-warm")
	cpu0 := processCPU()
	start := time.Now()
	actx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	var wg sync.WaitGroup
	if phase != "alone" {
		// Sixteen at once, every half second, for the whole phase: one
		// curl sends a round in parallel, at the lowest priority, so the
		// attacker's own work (another machine's, in the world) takes as
		// little as may be of the cores the cell runs on.
		cfg := filepath.Join(dir, "round.curl")
		if err := os.WriteFile(cfg, curlRound(bed.cell.URL+"/v1/batches", bed.tokens["mallory"], body, 16), 0o600); err != nil {
			return res, err
		}
		wg.Go(func() { attackRounds(actx, curl, cfg, &mu, &res) })
	}
	lat, err := steadyLatencies(ctx, bed, load, "s9")
	stop()
	wg.Wait()
	res.Window, res.CPU = time.Since(start), processCPU()-cpu0
	if err != nil {
		return res, err
	}
	slices.Sort(lat)
	res.Steady = len(lat)
	if len(lat) > 0 {
		res.P50, res.P99, res.Max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	fmt.Fprintf(os.Stderr, "  %s: acme %d submissions p50 %v p99 %v max %v; mallory %d requests %v; cell CPU %v over %.1f s\n",
		phase, res.Steady, res.P50.Round(time.Microsecond), res.P99.Round(time.Microsecond), res.Max.Round(time.Microsecond),
		res.Attacks, res.ByStatus, res.CPU.Round(time.Millisecond), res.Window.Seconds())
	return res, nil
}

// attackLimits sets scenario 9's provider capacity and its tenants'
// rates for phase.
func attackLimits(ctx context.Context, bed *benchBed, phase string) error {
	if err := bed.sim.SetCapacity(sim.Capacity{Rate: 200, Burst: 20, Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 50 * time.Millisecond}}); err != nil {
		return err
	}
	// acme may send what it sends. mallory may send everything it sends
	// in the attacked phase (each body is read to its first fault), one
	// request a minute in the limited phase (all but the first refused
	// for its rate, before a byte of the body is read).
	if err := bed.cell.Env.Store.SetRate(ctx, "acme", 6000, 100); err != nil {
		return err
	}
	if phase == "limited" {
		return bed.cell.Env.Store.SetRate(ctx, "mallory", 1, 1)
	}
	return nil
}

// attackRounds sends a round of the curl config cfg every half second
// until ctx ends, counting each request's status in res under mu.
func attackRounds(ctx context.Context, curl, cfg string, mu *sync.Mutex, res *attackResult) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		out, _ := exec.CommandContext(ctx, "nice", "-n", "19", curl, "-s", "-Z", "--parallel-max", "16", "-K", cfg).Output()
		if ctx.Err() != nil {
			return
		}
		mu.Lock()
		for _, f := range strings.Fields(string(out)) {
			code := 0
			_, _ = fmt.Sscan(f, &code)
			res.Attacks++
			res.ByStatus[code]++
		}
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// steadyLatencies submits acme's work at 20/s for d and returns each
// answer's time from send to status.
func steadyLatencies(ctx context.Context, bed *benchBed, d time.Duration, prefix string) ([]time.Duration, error) {
	client := benchClient()
	mk := moderationOf(prefix)
	var mu sync.Mutex
	var lat []time.Duration
	var failed error
	err := openLoop(ctx, 20, d, func(i int) {
		req := mk(i)
		req.Lane = "interactive"
		t0 := time.Now()
		status, answer, err := postWork(ctx, client, bed.cell.URL, bed.tokens["acme"], req)
		took := time.Since(t0)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || (status != http.StatusAccepted && status != http.StatusOK) {
			failed = fmt.Errorf("a steady submission got %d %s (%v)", status, answer, err)
			return
		}
		lat = append(lat, took)
	})
	if err == nil {
		err = failed
	}
	return lat, err
}

// curlRound is a curl config of n POSTs of the file body to url, each
// writing its status on a line of its own.
func curlRound(url, token, body string, n int) []byte {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString("next\n")
		}
		fmt.Fprintf(&b, "url = %q\nrequest = \"POST\"\nheader = \"Authorization: Bearer %s\"\ndata-binary = \"@%s\"\noutput = \"/dev/null\"\nwrite-out = \"%%{http_code}\\n\"\n",
			url, token, body)
	}
	return []byte(b.String())
}

// postWork submits req and returns the answer's status and body.
func postWork(ctx context.Context, client *http.Client, url, token string, req ingress.SubmitRequest) (int, []byte, error) {
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/work", bytes.NewReader(body))
	hr.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(hr)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, answer, err
}

// attackBatch is the body of the refused-batch attack: 3.5 MB, one item,
// and 200,000 keys that no request has.
func attackBatch() []byte {
	var b strings.Builder
	b.WriteString(`{"contract":"moderation","items":[{"itemId":"a","input":{"text":"x"}}],"x":{`)
	for i := range 200_000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"key%06d":"val"`, i)
	}
	b.WriteString(`}}`)
	return []byte(b.String())
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func printAttackTable(w io.Writer, rs []attackResult) {
	var alone attackResult
	for _, r := range rs {
		if r.Phase == "alone" {
			alone = r
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | phase | steady submissions | answer p50 / p99 / max ms | p99 / alone p99 (≤ 2×) | attack requests (by status) | cell CPU s | CPU per attack request ms (≤ 10) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		ratio, per := "–", "–"
		if r.Phase != "alone" && alone.P99 > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(r.P99)/float64(alone.P99))
		}
		if r.Attacks > 0 && alone.Window > 0 {
			// The phase's CPU less what the same window cost without the
			// attack, over the attack's requests.
			base := time.Duration(float64(alone.CPU) * r.Window.Seconds() / alone.Window.Seconds())
			per = fmt.Sprintf("%.3f", float64(r.CPU-base)/float64(r.Attacks)/1e6)
		}
		fmt.Fprintf(w, "| 9 | %s | %d | %.2f / %.2f / %.2f | %s | %d %v | %.2f | %s |\n", r.Phase, r.Steady,
			float64(r.P50)/1e6, float64(r.P99)/1e6, float64(r.Max)/1e6, ratio, r.Attacks, r.ByStatus, r.CPU.Seconds(), per)
	}
}
