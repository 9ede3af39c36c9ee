package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"assay.dev/pkg/model"
)

// withWork sets the correlation's work id ("" drops it).
func withWork(id string) reqOpt {
	return func(r *model.ChatRequest) {
		r.Messages = model.Messages("Classify the text.", model.Correlation{WorkID: id, SchemaVersion: json.RawMessage(`"1.0"`)}, "", json.RawMessage(model.Input(r.Messages)))
	}
}

// serve answers one moderation call in-process, so that it runs on the
// synctest clock.
func serve(t *testing.T, s *Server, tenant, work string) *httptest.ResponseRecorder {
	t.Helper()
	b, err := json.Marshal(chatReq(ContractModeration, tenant, `{"text":"hello"}`, withWork(work)))
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(b))))
	return w
}

// throttled checks a capacity 429 and returns its retry-after-ms.
func throttled(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", w.Code, w.Body)
	}
	typ, code := apiErr(t, result{status: w.Code, header: w.Header(), body: w.Body.Bytes()})
	if typ != "requests" || code != "rate_limit_exceeded" {
		t.Fatalf("error type %q code %q", typ, code)
	}
	ms := w.Header().Get("Retry-After-Ms")
	if ms == "" || w.Header().Get("Retry-After") == "" {
		t.Fatalf("headers %v", w.Header())
	}
	return ms
}

func mustSet(t *testing.T, s *Server, c Capacity) {
	t.Helper()
	if err := s.SetCapacity(c); err != nil {
		t.Fatal(err)
	}
}

func checkSums(t *testing.T, st Stats) {
	t.Helper()
	var total TenantStats
	for _, ts := range st.Tenants {
		if ts.Calls != ts.OK+ts.RateLimited+ts.Faulted+ts.BadRequest+ts.Throttled || ts.Accepted != ts.OK+ts.RateLimited+ts.Faulted {
			t.Errorf("tenant counters do not add up: %+v", ts)
		}
		total.Calls += ts.Calls
		total.Accepted += ts.Accepted
		total.Throttled += ts.Throttled
		total.Early += ts.Early
	}
	if st.Total != total.Calls || st.Accepted != total.Accepted || st.Throttled != total.Throttled || st.Early != total.Early {
		t.Errorf("totals %+v, tenants sum to %+v", st, total)
	}
}

func TestCapacityBucketRetryAfterExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{})
		defer s.Close()
		mustSet(t, s, Capacity{Rate: 3, Burst: 1})
		if w := serve(t, s, "acme", "w0"); w.Code != http.StatusOK {
			t.Fatalf("first call %d", w.Code)
		}
		// 1/3 s = 333.33…ms, rounded up.
		w := serve(t, s, "acme", "w1")
		if ms := throttled(t, w); ms != "334" || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("retry-after-ms %s Retry-After %s", ms, w.Header().Get("Retry-After"))
		}
		time.Sleep(100 * time.Millisecond)
		if ms := throttled(t, serve(t, s, "acme", "w2")); ms != "234" {
			t.Fatalf("after 100ms: retry-after-ms %s, want 234", ms)
		}
		time.Sleep(time.Second/3 - 100*time.Millisecond - time.Nanosecond)
		if ms := throttled(t, serve(t, s, "acme", "w3")); ms != "1" {
			t.Fatalf("a nanosecond early: retry-after-ms %s, want 1", ms)
		}
		time.Sleep(time.Nanosecond)
		if w := serve(t, s, "acme", "w4"); w.Code != http.StatusOK {
			t.Fatalf("on time: status %d", w.Code)
		}
	})
}

func TestCapacityBucketAdmitsRateTimesWindowPlusBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{})
		defer s.Close()
		mustSet(t, s, Capacity{Rate: 10, Burst: 5})
		type call struct {
			at   time.Duration
			wait time.Duration // 429: the retry-after-ms given
		}
		var admitted, refused []call
		start := time.Now()
		for i := range 101 { // 0 to 1s, every 10ms
			if i > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			w := serve(t, s, "acme", fmt.Sprintf("w%d", i))
			at := time.Since(start)
			if w.Code == http.StatusOK {
				admitted = append(admitted, call{at: at})
				continue
			}
			var ms int64
			fmt.Sscan(throttled(t, w), &ms)
			refused = append(refused, call{at, time.Duration(ms) * time.Millisecond})
		}
		// Burst 5 at once, then Rate×1s = 10 more.
		if len(admitted) != 15 {
			t.Fatalf("admitted %d over 1s, want 15: %v", len(admitted), admitted)
		}
		// Each 429 names exactly the time until the next admitted call.
		for _, r := range refused {
			i := slices.IndexFunc(admitted, func(a call) bool { return a.at > r.at })
			if i < 0 {
				if r.at < 900*time.Millisecond {
					t.Fatalf("refusal at %v has no later admission", r.at)
				}
				continue
			}
			if want := admitted[i].at - r.at; r.wait != want {
				t.Errorf("429 at %v said %v, next admission was %v later", r.at, r.wait, want)
			}
		}
		st := s.Stats()
		if a := st.Tenants["acme"]; a.Calls != 101 || a.Accepted != 15 || a.Throttled != 86 || a.Early != 0 || a.OK != 15 {
			t.Fatalf("stats %+v", a)
		}
		checkSums(t, st)
	})
}

func TestCapacityConcurrencyRetryAfterEarliestFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{Latency: time.Hour}) // the capacity's latency replaces it
		defer s.Close()
		mustSet(t, s, Capacity{Concurrency: 2, Latency: Latency{Kind: LatencyFixed, Base: 100 * time.Millisecond}})
		start := time.Now()
		var wg sync.WaitGroup
		answered := make(chan time.Duration, 4)
		launch := func(work string) {
			wg.Go(func() {
				if w := serve(t, s, "acme", work); w.Code != http.StatusOK {
					t.Errorf("%s: status %d", work, w.Code)
				}
				answered <- time.Since(start)
			})
		}
		launch("a") // ends at 100ms
		time.Sleep(30 * time.Millisecond)
		launch("b") // ends at 130ms
		synctest.Wait()
		w := serve(t, s, "acme", "c")
		if ms := throttled(t, w); ms != "70" || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("at 30ms: retry-after-ms %s Retry-After %s, want 70 and 1", ms, w.Header().Get("Retry-After"))
		}
		time.Sleep(70 * time.Millisecond)
		synctest.Wait()
		if got := <-answered; got != 100*time.Millisecond {
			t.Fatalf("a answered at %v, want 100ms", got)
		}
		launch("c") // ends at 200ms
		synctest.Wait()
		if ms := throttled(t, serve(t, s, "acme", "d")); ms != "30" {
			t.Fatalf("at 100ms: retry-after-ms %s, want 30 (b ends at 130ms)", ms)
		}
		wg.Wait()
		st := s.Stats()
		if a := st.Tenants["acme"]; a.Calls != 5 || a.Accepted != 3 || a.Throttled != 2 || a.OK != 3 {
			t.Fatalf("stats %+v", a)
		}
		checkSums(t, st)
	})
}

func TestCapacityStepHalvesThenRestores(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{})
		defer s.Close()
		mustSet(t, s, Capacity{Rate: 10, Burst: 1, Steps: []Step{{At: time.Second, Factor: 0.5}, {At: 2 * time.Second, Factor: 1}}})
		var perSecond [3]int
		for i := range 300 {
			if i > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			w := serve(t, s, "acme", fmt.Sprintf("w%d", i))
			if w.Code == http.StatusOK {
				perSecond[i/100]++
			}
			if i == 101 { // 1.01s: halved, the next token is at 1.2s
				if ms := throttled(t, w); ms != "190" {
					t.Fatalf("at 1.01s retry-after-ms %s, want 190", ms)
				}
			}
		}
		if perSecond != [3]int{10, 5, 10} {
			t.Fatalf("admitted per second %v, want [10 5 10]", perSecond)
		}
	})
}

func TestCapacityStepOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{})
		defer s.Close()
		mustSet(t, s, Capacity{Rate: 10, Burst: 5, Concurrency: 4, Steps: []Step{{At: 500 * time.Millisecond, Factor: 0}, {At: 2 * time.Second, Factor: 1}}})
		time.Sleep(600 * time.Millisecond)
		// Tokens were dropped at the outage; the bucket refills from empty
		// once it ends, so the next token is at 2.1s.
		w := serve(t, s, "acme", "w")
		if ms := throttled(t, w); ms != "1500" || w.Header().Get("Retry-After") != "2" {
			t.Fatalf("retry-after-ms %s Retry-After %s", ms, w.Header().Get("Retry-After"))
		}
		mustSet(t, s, Capacity{Rate: 10, Steps: []Step{{At: 0, Factor: 0}}})
		if ms := throttled(t, serve(t, s, "acme", "w2")); ms != fmt.Sprint(noCapacityWait.Milliseconds()) {
			t.Fatalf("capacity never back: retry-after-ms %s", ms)
		}
	})
}

func TestCapacityScaling(t *testing.T) {
	cs := newCapState(Capacity{Rate: 10, Burst: 3, Concurrency: 4}, time.Now())
	for _, c := range []struct {
		f     float64
		limit int
		burst float64
	}{{1, 4, 3}, {0.5, 2, 1.5}, {0.3, 1, 1}, {0.1, 1, 1}, {0, 0, 0}, {2, 8, 6}} {
		if l, b := cs.limit(c.f), cs.burst(c.f); l != c.limit || b != c.burst {
			t.Errorf("factor %v: limit %d burst %v, want %d %v", c.f, l, b, c.limit, c.burst)
		}
	}
	if l := newCapState(Capacity{Rate: 1}, time.Now()).limit(0.5); l != -1 {
		t.Errorf("no concurrency set: limit %d, want unlimited", l)
	}

	// The ceiling halves under four calls in flight: a slot is free once
	// three of them end, the hang never does.
	t0 := time.Now()
	cs = newCapState(Capacity{Concurrency: 4, Steps: []Step{{At: time.Second, Factor: 0.5}}}, t0)
	ms := time.Millisecond
	inFlight := map[int64]time.Time{1: t0.Add(1100 * ms), 2: t0.Add(1300 * ms), 3: t0.Add(1200 * ms), 4: {}}
	if wait, refused := cs.admit(t0.Add(time.Second), inFlight); refused != refusedConcurrency || wait != 300*ms {
		t.Errorf("shrunk ceiling: wait %v refused %q, want 300ms", wait, refused)
	}
	if wait, refused := cs.admit(t0.Add(999*ms), inFlight); refused != refusedConcurrency || wait != 301*ms {
		t.Errorf("before the step: wait %v refused %q, want 301ms", wait, refused)
	}
	// An overdue call is about to answer.
	if wait, _ := cs.admit(t0.Add(2*time.Second), map[int64]time.Time{1: t0, 2: {}}); wait != 1 {
		t.Errorf("overdue: wait %v, want 1ns", wait)
	}
}

func TestEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{})
		defer s.Close()
		early := func(tenant string) int64 { return s.Stats().Tenants[tenant].Early }

		// A rate_limit fault's Retry-After, for work w1.
		if err := s.AddFault(Fault{Kind: FaultRateLimit, RetryAfter: 1500 * time.Millisecond, Times: 1}); err != nil {
			t.Fatal(err)
		}
		if w := serve(t, s, "acme", "w1"); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After-Ms") != "1500" {
			t.Fatalf("fault: %d %v", w.Code, w.Header())
		}
		time.Sleep(time.Second)
		if w := serve(t, s, "acme", "w2"); w.Code != http.StatusOK || early("acme") != 0 {
			t.Fatalf("other work counted early: %d %+v", w.Code, s.Stats())
		}
		if w := serve(t, s, "acme", "w1"); w.Code != http.StatusOK || early("acme") != 1 {
			t.Fatalf("retry after 1s of 1.5s: %d early %d, want 200 and 1", w.Code, early("acme"))
		}
		time.Sleep(500 * time.Millisecond)
		if serve(t, s, "acme", "w1"); early("acme") != 1 {
			t.Fatalf("retry after 1.5s counted early")
		}

		// A capacity 429's Retry-After; the hint is exact to the millisecond.
		mustSet(t, s, Capacity{Rate: 1, Burst: 1})
		serve(t, s, "globex", "w3")
		if ms := throttled(t, serve(t, s, "globex", "w3")); ms != "1000" {
			t.Fatalf("retry-after-ms %s", ms)
		}
		time.Sleep(999 * time.Millisecond)
		if ms := throttled(t, serve(t, s, "globex", "w3")); ms != "1" || early("globex") != 1 {
			t.Fatalf("1ms early: retry-after-ms %s early %d", ms, early("globex"))
		}
		time.Sleep(time.Millisecond)
		if w := serve(t, s, "globex", "w3"); w.Code != http.StatusOK || early("globex") != 1 {
			t.Fatalf("on time: %d early %d", w.Code, early("globex"))
		}

		// Without a work id the key is the tenant.
		time.Sleep(time.Second)
		serve(t, s, "solo", "")
		throttled(t, serve(t, s, "solo", ""))
		if serve(t, s, "solo", ""); early("solo") != 1 || early("acme") != 1 {
			t.Fatalf("tenant key: %+v", s.Stats())
		}
		st := s.Stats()
		if st.Early != 3 {
			t.Fatalf("total early %d, want 3", st.Early)
		}
		checkSums(t, st)
		s.ResetStats()
		if st := s.Stats(); st.Early != 0 || st.Throttled != 0 || st.Accepted != 0 || len(s.notBefore) != 0 {
			t.Fatalf("after reset %+v, %d hints", st, len(s.notBefore))
		}
	})
}

func TestNotBeforeBounded(t *testing.T) {
	s := New(Options{})
	now := time.Now()
	for i := range 10 * minSweep {
		now = now.Add(time.Millisecond)
		s.notBeforeLocked(fmt.Sprint("k", i), now.Add(10*time.Millisecond), now)
		if len(s.notBefore) > minSweep {
			t.Fatalf("%d hints kept after %d given, at most 10 running", len(s.notBefore), i+1)
		}
	}
	// Hints still running are kept, however many.
	for i := range 3 * minSweep {
		s.notBeforeLocked(fmt.Sprint("live", i), now.Add(time.Hour), now)
	}
	if n := len(s.notBefore); n < 3*minSweep || n > 6*minSweep {
		t.Fatalf("%d hints, want the %d running and at most as many spent", n, 3*minSweep)
	}
}

func TestLatencyKinds(t *testing.T) {
	draws := func(l Latency, n int) []time.Duration {
		cs := newCapState(Capacity{Latency: l}, time.Now())
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = l.draw(cs.rng)
		}
		return out
	}
	ms := time.Millisecond
	for _, d := range draws(Latency{Kind: LatencyFixed, Base: 40 * ms}, 10) {
		if d != 40*ms {
			t.Fatalf("fixed drew %v", d)
		}
	}

	u := Latency{Kind: LatencyUniform, Base: 50 * ms, Spread: 20 * ms, Seed: 7}
	a := draws(u, 1000)
	if lo, hi := slices.Min(a), slices.Max(a); lo < 50*ms || hi > 70*ms || hi-lo < 19*ms {
		t.Fatalf("uniform in [%v, %v], want spread over [50ms, 70ms]", lo, hi)
	}
	if !slices.Equal(a, draws(u, 1000)) {
		t.Fatal("uniform not deterministic for a seed")
	}
	u.Seed = 8
	if slices.Equal(a, draws(u, 1000)) {
		t.Fatal("uniform ignores the seed")
	}

	for _, spread := range []time.Duration{0, 400 * ms} {
		l := Latency{Kind: LatencyLongtail, Base: 100 * ms, Spread: spread, Seed: 3}
		a := draws(l, 20001)
		sorted := slices.Sorted(slices.Values(a))
		limit := 100*ms + spread
		if spread == 0 {
			limit = longtailCap * 100 * ms
		}
		med := sorted[len(sorted)/2]
		if med < 90*ms || med > 110*ms {
			t.Errorf("spread %v: median %v, want about 100ms", spread, med)
		}
		if p99 := sorted[len(sorted)*99/100]; p99 < 4*100*ms {
			t.Errorf("spread %v: p99 %v, want a tail beyond 4×", spread, p99)
		}
		if sorted[0] <= 0 || sorted[len(sorted)-1] > limit {
			t.Errorf("spread %v: range [%v, %v], want (0, %v]", spread, sorted[0], sorted[len(sorted)-1], limit)
		}
		if !slices.Equal(a, draws(l, 20001)) {
			t.Errorf("spread %v: not deterministic for a seed", spread)
		}
	}
}

func TestCapacityLatencyReplacesOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Options{Latency: time.Hour})
		defer s.Close()
		mustSet(t, s, Capacity{Latency: Latency{Base: 50 * time.Millisecond}})
		if c := s.Capacity(); c.Latency.Kind != LatencyFixed {
			t.Fatalf("kind not defaulted: %+v", c)
		}
		t0 := time.Now()
		if w := serve(t, s, "acme", "w"); w.Code != http.StatusOK || time.Since(t0) != 50*time.Millisecond {
			t.Fatalf("status %d after %v, want 200 after 50ms", w.Code, time.Since(t0))
		}
		s.ClearCapacity()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, _ := json.Marshal(chatReq(ContractModeration, "acme", `{"text":"x"}`))
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(string(b))))
		if time.Since(t0) != 50*time.Millisecond+time.Minute || w.Body.Len() != 0 {
			t.Fatalf("Options.Latency not back after ClearCapacity: %v %q", time.Since(t0), w.Body)
		}
	})
}

func TestSetCapacityValidation(t *testing.T) {
	s := New(Options{})
	bad := map[string]Capacity{
		"negative rate":        {Rate: -1},
		"burst without rate":   {Burst: 3},
		"negative concurrency": {Concurrency: -2},
		"steps without limits": {Steps: []Step{{At: time.Second, Factor: 0.5}}},
		"steps out of order":   {Rate: 1, Steps: []Step{{At: 2 * time.Second, Factor: 1}, {At: time.Second, Factor: 1}}},
		"negative factor":      {Rate: 1, Steps: []Step{{At: time.Second, Factor: -1}}},
		"negative step":        {Rate: 1, Steps: []Step{{At: -time.Second, Factor: 1}}},
		"unknown latency":      {Latency: Latency{Kind: "pareto", Base: time.Second}},
		"fixed with spread":    {Latency: Latency{Base: time.Second, Spread: time.Second}},
		"longtail no base":     {Latency: Latency{Kind: LatencyLongtail}},
		"negative latency":     {Latency: Latency{Kind: LatencyUniform, Base: -time.Second}},
	}
	for name, c := range bad {
		if err := s.SetCapacity(c); err == nil || !strings.HasPrefix(err.Error(), "sim: ") {
			t.Errorf("%s: err %v", name, err)
		}
	}
	if s.capa != nil {
		t.Fatal("a refused capacity was set")
	}
	mustSet(t, s, Capacity{Rate: 25})
	if c := s.Capacity(); c.Burst != 2 {
		t.Fatalf("default burst %d, want 2", c.Burst)
	}
	mustSet(t, s, Capacity{Rate: 0.5})
	if c := s.Capacity(); c.Burst != 1 {
		t.Fatalf("default burst %d, want 1", c.Burst)
	}
	mustSet(t, s, Capacity{})
	if s.capa != nil {
		t.Fatal("zero capacity is not unlimited")
	}
}

func TestCapacityHTTP(t *testing.T) {
	s, base := start(t)
	for _, bad := range []string{
		`nope`,
		`{"rate":-1}`,
		`{"rate":"fast"}`,
		`{"rat":1}`,
		`{"rate":1} {"rate":2}`,
		`{"latency":{"kind":"pareto","base":"1s"}}`,
		`{"latency":{"kind":"fixed","base":"soon"}}`,
		`{"latency":{"kind":"fixed","bsae":"1s"}}`,
		`{"rate":1,"steps":[{"at":"1s"}]}`,
		`{"rate":1,"steps":[{"at":"1s","factor":0.5,"until":"2s"}]}`,
	} {
		r := mustDo(t, "POST", base+"/sim/capacity", bad)
		if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: status %d", bad, r.status)
			continue
		}
		if typ, code := apiErr(t, r); typ != "invalid_request_error" || code != "invalid_capacity" {
			t.Errorf("%s: error %q %q", bad, typ, code)
		}
	}
	if s.Capacity().Rate != 0 {
		t.Fatal("a refused capacity was set")
	}

	body := `{"rate":0.001,"concurrency":8,"latency":{"kind":"longtail","base":"20ms","spread":"1s","seed":9},"steps":[{"at":"1h","factor":0.5},{"at":"2h","factor":1}]}`
	r := mustDo(t, "POST", base+"/sim/capacity", body)
	if r.status != http.StatusOK {
		t.Fatalf("set capacity %d %s", r.status, r.body)
	}
	want := Capacity{Rate: 0.001, Burst: 1, Concurrency: 8,
		Latency: Latency{Kind: LatencyLongtail, Base: 20 * time.Millisecond, Spread: time.Second, Seed: 9},
		Steps:   []Step{{At: time.Hour, Factor: 0.5}, {At: 2 * time.Hour, Factor: 1}}}
	var got Capacity
	if err := json.Unmarshal(r.body, &got); err != nil || !capEqual(got, want) || !capEqual(s.Capacity(), want) {
		t.Fatalf("echo %v %+v, want %+v", err, got, want)
	}
	r = mustDo(t, "GET", base+"/sim/capacity", nil)
	if err := json.Unmarshal(r.body, &got); err != nil || !capEqual(got, want) {
		t.Fatalf("get %v %s", err, r.body)
	}

	// One token in 1000s: the second call is throttled, and the adapter
	// reads the millisecond hint.
	url := base + "/v1/chat/completions"
	if r := mustDo(t, "POST", url, chatReq(ContractModeration, "acme", `{"text":"x"}`, withWork("h1"))); r.status != http.StatusOK {
		t.Fatalf("first call %d", r.status)
	}
	c := &model.Client{BaseURL: APIBase(base)}
	_, err := c.Complete(context.Background(), model.Call{Tenant: "acme", Contract: ContractModeration, Schema: json.RawMessage(`{}`),
		Messages: model.Messages("Classify.", model.Correlation{WorkID: "h2", SchemaVersion: json.RawMessage(`"1.0"`)}, "", json.RawMessage(`{"text":"y"}`))})
	var me *model.Error
	if !errors.As(err, &me) || me.Kind != model.KindRateLimited || me.RetryAfter <= 990*time.Second || me.RetryAfter > 1000*time.Second || me.RetryAfter%time.Millisecond != 0 {
		t.Fatalf("adapter error %v (retry after %v)", err, me.RetryAfter)
	}

	r = mustDo(t, "GET", base+"/sim/stats", nil)
	var raw map[string]any
	if err := json.Unmarshal(r.body, &raw); err != nil || raw["accepted"] != 1.0 || raw["throttled"] != 1.0 || raw["early"] != 0.0 {
		t.Fatalf("stats %v %s", err, r.body)
	}
	acme, _ := raw["tenants"].(map[string]any)["acme"].(map[string]any)
	if acme["accepted"] != 1.0 || acme["throttled"] != 1.0 || acme["calls"] != 2.0 {
		t.Fatalf("tenant stats %s", r.body)
	}

	if r := mustDo(t, "DELETE", base+"/sim/capacity", nil); r.status != http.StatusNoContent {
		t.Fatalf("delete %d", r.status)
	}
	if r := mustDo(t, "GET", base+"/sim/capacity", nil); strings.TrimSpace(string(r.body)) != "{}" {
		t.Fatalf("after delete %s", r.body)
	}
	if r := mustDo(t, "POST", url, chatReq(ContractModeration, "acme", `{"text":"x"}`, withWork("h3"))); r.status != http.StatusOK {
		t.Fatalf("unlimited again: %d", r.status)
	}
}

func capEqual(a, b Capacity) bool {
	return a.Rate == b.Rate && a.Burst == b.Burst && a.Concurrency == b.Concurrency && a.Latency == b.Latency && slices.Equal(a.Steps, b.Steps)
}
