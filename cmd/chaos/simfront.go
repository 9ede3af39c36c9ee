package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/model"
)

// simFront stands in front of the simulated provider, in the harness
// process. It counts calls per work item (the provider counts per tenant)
// and can kill the calling classifier at a precise moment: after the
// provider has answered, and counted, a call, before the answer reaches the
// classifier.
type simFront struct {
	sim *sim.Server
	// regionOf maps a tenant to its home region, which names the
	// classifier that made the call.
	regionOf map[string]string

	mu      sync.Mutex
	perWork map[string]int
	armed   map[string]func(workID string) // region -> what to do after the answer
}

func newSimFront(s *sim.Server, regionOf map[string]string) *simFront {
	return &simFront{sim: s, regionOf: regionOf, perWork: map[string]int{}, armed: map[string]func(string){}}
}

// arm makes the next answered call from region run fn before the answer is
// written back; fn typically SIGKILLs that region's classifier.
func (f *simFront) arm(region string, fn func(workID string)) {
	f.mu.Lock()
	f.armed[region] = fn
	f.mu.Unlock()
}

// disarm removes an arm that never fired.
func (f *simFront) disarm(region string) {
	f.mu.Lock()
	delete(f.armed, region)
	f.mu.Unlock()
}

// calls returns a copy of the per-work call counts.
func (f *simFront) calls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.perWork))
	for k, v := range f.perWork {
		out[k] = v
	}
	return out
}

func (f *simFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		f.sim.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 32<<20))
	if err != nil {
		// The caller went away mid-request (or sent more than any
		// request of the cell's): the provider never saw it.
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req model.ChatRequest
	var fire func(string)
	workID := ""
	if json.Unmarshal(body, &req) == nil {
		if c, err := model.ParseCorrelation(req.Messages); err == nil {
			workID = c.WorkID
		}
		f.mu.Lock()
		if workID != "" {
			f.perWork[workID]++
		}
		region := f.regionOf[req.User]
		if fn, ok := f.armed[region]; ok {
			fire = fn
			delete(f.armed, region)
		}
		f.mu.Unlock()
	}
	if fire == nil {
		f.sim.ServeHTTP(w, r)
		return
	}
	// The provider answers (and counts the call); the classifier dies
	// before it reads the answer.
	rec := httptest.NewRecorder()
	f.sim.ServeHTTP(rec, r)
	fire(workID)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
