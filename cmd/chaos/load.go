package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"assay.dev/pkg/evalset"
)

// submission is one ingress key and what the ingress answered for it.
type submission struct {
	Index    int
	Tenant   tenant
	Contract string
	Lane     string
	SourceID string
	Body     []byte
	// Times is how many identical requests are sent at once (1, or
	// Options.DupTimes for a duplicated key).
	Times int

	mu      sync.Mutex
	WorkIDs map[string]int // work id -> answers naming it
	Created int            // 202 answers
	Acked   bool
	AckedAt time.Time // the first answer naming a work id
	Errors  []string
}

// loadStats count what the load generator saw.
type loadStats struct {
	requests, retries, unavailable, throttled, netErrors atomic.Int64

	mu sync.Mutex
	// longestRetry is the longest Retry-After ingress answered, per lane.
	longestRetry map[string]time.Duration
}

func (st *loadStats) sawRetry(lane string, d time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.longestRetry == nil {
		st.longestRetry = map[string]time.Duration{}
	}
	st.longestRetry[lane] = max(st.longestRetry[lane], d)
}

var moderationTexts = []string{
	"Great product, arrived on time and works as described.",
	"BUY NOW!!! free money at cheap-watches.example, buy now, buy now",
	"The checkout page kept timing out, please fix it.",
	"You people are idiots and I will find where you live.",
}

// plan makes the run's submissions from the seed: contracts, lanes and
// tenants mixed, every DupEvery-th key delivered DupTimes at once.
func (h *Harness) plan() []*submission {
	items := evalset.Items()
	tenants := h.tenantList()
	dupEvery := 0
	if h.o.DupKeys > 0 {
		dupEvery = max(1, h.o.Items/h.o.DupKeys)
	}
	out := make([]*submission, 0, h.o.Items)
	for i := range h.o.Items {
		t := tenants[h.rng.IntN(len(tenants))]
		it := items[h.rng.IntN(len(items))]
		var contract string
		var input any
		switch r := h.rng.IntN(100); {
		case r < 55:
			contract, input = "code-review", map[string]string{"diff": it.Diff, "title": it.Title}
		case r < 75:
			contract, input = "change-review", map[string]string{"diff": it.Diff, "title": it.Title}
		default:
			contract, input = "moderation", map[string]string{"text": moderationTexts[h.rng.IntN(len(moderationTexts))] + " #" + strconv.Itoa(i)}
		}
		lane := "interactive"
		if h.rng.IntN(5) == 0 {
			lane = "batch"
		}
		src := fmt.Sprintf("chaos/%s#%d", contract, i)
		// Each pull request its own head, as on GitHub: a head's check runs
		// are listed when a publication resumes.
		head := sha1.Sum([]byte(src))
		body, _ := json.Marshal(map[string]any{"contract": contract, "sourceId": src, "revision": hex.EncodeToString(head[:]),
			"lane": lane, "input": input})
		s := &submission{Index: i, Tenant: t, Contract: contract, Lane: lane, SourceID: src, Body: body, Times: 1,
			WorkIDs: map[string]int{}}
		if dupEvery > 0 && i%dupEvery == dupEvery/2 && len(out) < h.o.Items {
			s.Times = h.o.DupTimes
		}
		out = append(out, s)
	}
	return out
}

// drive submits every planned key, spread evenly over Options.Load, and
// returns when each has an answer or was given up.
func (h *Harness) drive(ctx context.Context, subs []*submission, st *loadStats) {
	work := make(chan *submission)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for range h.o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				var inner sync.WaitGroup
				start := make(chan struct{})
				for range s.Times {
					inner.Add(1)
					go func() {
						defer inner.Done()
						<-start
						h.submit(ctx, client, s, st)
					}()
				}
				close(start)
				inner.Wait()
			}
		}()
	}
	t0 := time.Now()
	step := h.o.Load / time.Duration(max(1, len(subs)))
	for i, s := range subs {
		if d := time.Until(t0.Add(time.Duration(i) * step)); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		work <- s
	}
	close(work)
	wg.Wait()
}

// submit sends one request like a careful client: a refused or unanswered
// request is sent again (same key, so the ingress fence makes it safe)
// until it is answered or GiveUp passes.
func (h *Harness) submit(ctx context.Context, client *http.Client, s *submission, st *loadStats) {
	giveUp := time.Now().Add(h.o.GiveUp)
	backoff := 100 * time.Millisecond
	for try := 0; ; try++ {
		if try > 0 {
			st.retries.Add(1)
		}
		st.requests.Add(1)
		status, workID, retryAfter, err := h.post(ctx, client, s)
		switch {
		case err == nil && (status == http.StatusAccepted || status == http.StatusOK):
			s.mu.Lock()
			s.WorkIDs[workID]++
			if !s.Acked {
				s.AckedAt = time.Now()
			}
			s.Acked = true
			if status == http.StatusAccepted {
				s.Created++
			}
			s.mu.Unlock()
			return
		case err != nil:
			st.netErrors.Add(1)
		case status == http.StatusTooManyRequests:
			st.throttled.Add(1)
		case status >= 500:
			st.unavailable.Add(1)
		default:
			s.mu.Lock()
			s.Errors = append(s.Errors, fmt.Sprintf("HTTP %d", status))
			s.mu.Unlock()
			return
		}
		if time.Now().After(giveUp) || ctx.Err() != nil {
			s.mu.Lock()
			s.Errors = append(s.Errors, fmt.Sprintf("gave up after %d tries (last: HTTP %d, %v)", try+1, status, err))
			s.mu.Unlock()
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if retryAfter > 0 {
			st.sawRetry(s.Lane, retryAfter)
			// Honoured, but not past the client's own patience.
			wait = max(time.Second, min(retryAfter, time.Until(giveUp)))
		}
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (h *Harness) post(ctx context.Context, client *http.Client, s *submission) (status int, workID string, retryAfter time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ingressURL(s.Tenant.Region)+"/v1/work", bytes.NewReader(s.Body))
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Tenant.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, "", 0, err
	}
	if v, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && v > 0 {
		retryAfter = time.Duration(v) * time.Second
	}
	var body struct {
		WorkID string `json:"workId"`
	}
	if resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &body); err != nil || body.WorkID == "" {
			return resp.StatusCode, "", 0, fmt.Errorf("answer without a work id: %s", b)
		}
	}
	return resp.StatusCode, body.WorkID, retryAfter, nil
}
