// Package sim is the simulated model provider: a real HTTP server speaking the
// OpenAI-compatible chat-completions protocol, answering the seed contracts
// with a deterministic reviewer (or, for a model NoisyModel names, one that
// drops parts of its answers at random), counting every call per tenant, limiting
// calls to a settable, moving capacity and injecting the faults a real
// provider shows (rate limits, hangs, broken or schema-invalid answers,
// wrong correlation, ungrounded findings).
package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/model"
)

// DefaultModel is the model name reported when neither the request nor the
// options name one.
const DefaultModel = "assay-sim-1"

// DatedSuffix is what the renamed fault adds to the model's name.
const DatedSuffix = "-2024-07-18"

// Contract names, as sent in response_format.json_schema.name.
const (
	ContractCodeReview   = "code-review"
	ContractChangeReview = "change-review"
	ContractModeration   = "moderation"
)

// AnonymousTenant is the tenant a request without a user field counts under.
const AnonymousTenant = "-"

// maxBody bounds a request body; diffs are large but not unbounded.
const maxBody = 32 << 20

// Options configure a Server.
type Options struct {
	Model   string        // reported model when the request names none; default "assay-sim-1"
	Latency time.Duration // added to every answered call unless a Capacity sets its own; 0 by default
	Logger  *slog.Logger  // nil discards
	// Constant, for benchmarks, reviews each distinct diff once and
	// answers every later call for it from that review (with the call's
	// own change id), and looks for no injected instructions (an
	// obey_injection fault never applies): a fault-free call then costs
	// the provider next to nothing, so what is measured is the pipeline
	// around it.
	Constant bool
}

// Stats are the calls counted since start or the last ResetStats. Total,
// Accepted, Throttled and Early sum the tenants'.
type Stats struct {
	Total     int64                  `json:"total"`
	Accepted  int64                  `json:"accepted"`
	Throttled int64                  `json:"throttled"`
	Early     int64                  `json:"early"`
	Tenants   map[string]TenantStats `json:"tenants"`
}

// TenantStats count one tenant's calls. Every decoded call lands in exactly
// one outcome, so Calls == OK + RateLimited + Faulted + BadRequest +
// Throttled. A valid call is either Throttled or Accepted, so Accepted ==
// OK + RateLimited + Faulted. Early counts calls, whatever their outcome,
// that came before the Retry-After given for their key had passed.
type TenantStats struct {
	Calls       int64 `json:"calls"`
	OK          int64 `json:"ok"`          // answered with a valid output
	RateLimited int64 `json:"rateLimited"` // answered 429 by a rate_limit fault
	Faulted     int64 `json:"faulted"`     // any other fault applied (latency included)
	BadRequest  int64 `json:"badRequest"`  // refused with 400 before capacity and faults
	Throttled   int64 `json:"throttled"`   // answered 429 at once, beyond capacity
	Accepted    int64 `json:"accepted"`    // let through by capacity (every valid call when unlimited)
	Early       int64 `json:"early"`       // came before the Retry-After given for its key
	// PromptUnits and CompletionUnits are what the provider billed: the
	// usage of every 2xx answer it wrote, readable by the client or not.
	PromptUnits     int64 `json:"promptUnits"`
	CompletionUnits int64 `json:"completionUnits"`
	// CachedPromptUnits and ReasoningUnits are the part of those the
	// answers reported as cached_tokens and reasoning_tokens
	// (SetUsageDetails).
	CachedPromptUnits int64 `json:"cachedPromptUnits"`
	ReasoningUnits    int64 `json:"reasoningUnits"`
}

// Server is the simulated provider. It is an http.Handler and can also listen
// on its own with Start.
type Server struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux
	seq  atomic.Int64

	reviews sync.Map // diff text -> CodeReview, with Constant

	// noise is the draws of the noisy models (noise.go).
	noise noiseState

	mu     sync.Mutex
	faults []*Fault // Times counts down; a Times>0 fault is dropped at 0
	stats  map[string]*TenantStats
	capa   *capState // nil: unlimited
	// inFlight holds the planned end of each admitted call not yet
	// answered, zero for a hang.
	inFlight map[int64]time.Time
	flightID int64
	// notBefore is, per retry key, when the last Retry-After given runs
	// out; entries that ran out are swept once it reaches sweepAt.
	notBefore map[string]time.Time
	sweepAt   int

	// bat is the Batch API's state (batch.go).
	bat *batches
	// details are the usage details reported and the prompt cache
	// (usage.go).
	details usageDetails

	srvMu     sync.Mutex
	srv       *http.Server
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Server with no faults.
func New(opts Options) *Server {
	if opts.Model == "" {
		opts.Model = DefaultModel
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts: opts, log: log, mux: http.NewServeMux(), stats: map[string]*TenantStats{},
		inFlight: map[int64]time.Time{}, notBefore: map[string]time.Time{}, sweepAt: minSweep,
		done: make(chan struct{}), bat: newBatches(),
	}
	s.details.seed, s.details.prefixes = maphash.MakeSeed(), map[uint64]struct{}{}
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.routeBatches()
	s.routeUsageDetails()
	s.mux.HandleFunc("GET /sim/stats", s.handleStats)
	s.mux.HandleFunc("DELETE /sim/stats", func(w http.ResponseWriter, r *http.Request) {
		s.ResetStats()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Faults())
	})
	s.mux.HandleFunc("POST /sim/faults", s.handleAddFault)
	s.mux.HandleFunc("DELETE /sim/faults", func(w http.ResponseWriter, r *http.Request) {
		s.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("GET /sim/capacity", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Capacity())
	})
	s.mux.HandleFunc("POST /sim/capacity", s.handleSetCapacity)
	s.mux.HandleFunc("DELETE /sim/capacity", func(w http.ResponseWriter, r *http.Request) {
		s.ClearCapacity()
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// Answering at all is being ready, as the services' /readyz says.
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return s
}

// APIBase is the base URL of the simulated provider served at root, as an
// OpenAI SDK (and the model adapter) takes it: its API is under /v1, its
// /sim endpoints at root.
func APIBase(root string) string { return strings.TrimRight(root, "/") + "/v1" }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Start listens on addr ("127.0.0.1:0" picks a free port) and serves in the
// background. It returns the base URL without a trailing slash.
func (s *Server) Start(addr string) (string, error) {
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	select {
	case <-s.done:
		return "", errors.New("sim: server is closed")
	default:
	}
	if s.srv != nil {
		return "", errors.New("sim: server already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("sim: listen %s: %w", addr, err)
	}
	// No WriteTimeout: a hang fault holds its answer on purpose.
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 90 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	go func(srv *http.Server) {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("sim: serve", "err", err)
		}
	}(s.srv)
	return "http://" + ln.Addr().String(), nil
}

// Close stops the listener, drops open connections and releases hanging and
// sleeping calls. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	if s.srv == nil {
		return nil
	}
	return s.srv.Close()
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Tenants: make(map[string]TenantStats, len(s.stats))}
	for k, v := range s.stats {
		st.Tenants[k] = *v
		st.Total += v.Calls
		st.Accepted += v.Accepted
		st.Throttled += v.Throttled
		st.Early += v.Early
	}
	return st
}

// ResetStats zeroes the counters and forgets the Retry-After given, so that
// Early counts against hints given since.
func (s *Server) ResetStats() {
	s.mu.Lock()
	s.stats = map[string]*TenantStats{}
	s.notBefore = map[string]time.Time{}
	s.sweepAt = minSweep
	s.mu.Unlock()
}

type outcome int

const (
	outcomeOK outcome = iota
	outcomeRateLimited
	outcomeFaulted
	outcomeBadRequest
	outcomeThrottled
)

// record counts one call. It runs before the answer is written so that a
// client which has its answer always sees its call in Stats.
func (s *Server) record(tenant string, o outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordLocked(tenant, o, false)
}

func (s *Server) recordLocked(tenant string, o outcome, early bool) {
	ts := s.stats[tenant]
	if ts == nil {
		ts = &TenantStats{}
		s.stats[tenant] = ts
	}
	ts.Calls++
	if early {
		ts.Early++
	}
	switch o {
	case outcomeOK:
		ts.OK++
	case outcomeRateLimited:
		ts.RateLimited++
	case outcomeFaulted:
		ts.Faulted++
	case outcomeBadRequest:
		ts.BadRequest++
	case outcomeThrottled:
		ts.Throttled++
	}
	if o == outcomeOK || o == outcomeRateLimited || o == outcomeFaulted {
		ts.Accepted++
	}
}

// bill adds an answer's usage to what the tenant was billed.
func (s *Server) bill(tenant string, u model.Usage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.stats[tenant]
	if ts == nil {
		ts = &TenantStats{}
		s.stats[tenant] = ts
	}
	ts.PromptUnits += int64(u.PromptTokens)
	ts.CompletionUnits += int64(u.CompletionTokens)
	ts.CachedPromptUnits += int64(u.CachedInputTokens())
	ts.ReasoningUnits += int64(u.ReasoningTokens())
}

// minSweep is the notBefore size below which it is never swept.
const minSweep = 1024

// earlyLocked reports whether a call for key at now comes before the
// Retry-After last given for it, forgetting a hint that ran out.
func (s *Server) earlyLocked(key string, now time.Time) bool {
	nb, ok := s.notBefore[key]
	if !ok {
		return false
	}
	if now.Before(nb) {
		return true
	}
	delete(s.notBefore, key)
	return false
}

// notBeforeLocked records that key was told to wait until t. Hints that ran
// out are swept whenever the map doubles from its size after the last
// sweep (at least minSweep), so it stays within twice the hints running.
func (s *Server) notBeforeLocked(key string, t, now time.Time) {
	s.notBefore[key] = t
	if len(s.notBefore) < s.sweepAt {
		return
	}
	for k, nb := range s.notBefore {
		if !now.Before(nb) {
			delete(s.notBefore, k)
		}
	}
	s.sweepAt = max(minSweep, 2*len(s.notBefore))
}

func (s *Server) setNotBefore(key string, t time.Time) {
	s.mu.Lock()
	s.notBeforeLocked(key, t, time.Now())
	s.mu.Unlock()
}

// release ends an admitted call's hold on concurrency; it may run twice.
func (s *Server) release(id int64) {
	s.mu.Lock()
	delete(s.inFlight, id)
	s.mu.Unlock()
}

// call is a decoded, validated chat request.
type call struct {
	req      model.ChatRequest
	tenant   string
	contract string
	corr     model.Correlation
	input    string // the raw user message
	// injections are the instructions found in the untrusted input, found
	// here so that admit does not scan a large diff under its lock.
	injections []injection
	constant   bool   // Options.Constant: no injections looked for
	noise      *noise // a noisy model's draws for this call; nil for others
	diffText   string // code-review and change-review
	diff       *diff.Diff
	text       string // moderation
}

// handleChat answers one chat-completions call: refused as a bad request or
// beyond capacity, failed as its injected fault says, or with a completion.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	c := s.decodeCall(w, r)
	if c == nil {
		return
	}
	a := s.admit(c)
	if a.refused != "" {
		s.writeThrottled(w, c, a)
		return
	}
	// The slot is released before each answer is written, so a client
	// holding its answer never finds its own call still in flight.
	defer s.release(a.id)
	f := a.fault
	kind := ""
	if f != nil {
		kind = f.Kind
	}
	s.log.Debug("sim: call", "tenant", c.tenant, "contract", c.contract, "workId", c.corr.WorkID, "fault", kind)

	ctx := r.Context()
	if kind == FaultHang {
		s.hang(ctx)
		return
	}
	if !s.sleep(ctx, a.latency) {
		return
	}
	if s.writeFault(w, c, a) {
		return
	}
	if kind == FaultLatency && !s.sleep(ctx, f.Latency) {
		return
	}
	body, billed := s.completion(c, f, kind)
	s.bill(c.tenant, billed)
	s.release(a.id)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// decodeCall decodes and validates the request into a call. A request it
// refuses is answered 400, and counted when it decoded; it then returns nil.
func (s *Server) decodeCall(w http.ResponseWriter, r *http.Request) *call {
	var req model.ChatRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "could not decode the request body: "+err.Error())
		return nil
	}
	c := &call{req: req, tenant: req.User, constant: s.opts.Constant}
	if c.tenant == "" {
		c.tenant = AnonymousTenant
	}
	if msg := c.prepare(); msg != "" {
		s.record(c.tenant, outcomeBadRequest)
		s.log.Debug("sim: bad request", "tenant", c.tenant, "reason", msg)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", msg)
		return nil
	}
	return c
}

// writeThrottled answers a call refused by capacity: 429, with the wait as
// its Retry-After.
func (s *Server) writeThrottled(w http.ResponseWriter, c *call, a admission) {
	given, _ := setRetryAfter(w.Header(), a.wait)
	s.log.Debug("sim: throttled", "tenant", c.tenant, "workId", c.corr.WorkID, "beyond", a.refused, "retryAfter", given)
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
		fmt.Sprintf("Rate limit reached for %s on %s; please try again in %dms.", c.tenant, a.refused, given/time.Millisecond))
}

// hang holds a call that is never answered until the request goes away or
// the server closes.
func (s *Server) hang(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.done:
		// Abort the connection so the client sees a failure, not an
		// empty 200.
		panic(http.ErrAbortHandler)
	}
}

// writeFault answers an admitted call with its fault when the fault is a
// failure in place of an answer, and reports whether it did.
func (s *Server) writeFault(w http.ResponseWriter, c *call, a admission) bool {
	if a.fault == nil {
		return false
	}
	switch a.fault.Kind {
	case FaultRateLimit:
		secs := s.retryLater(w, c, a)
		writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded",
			fmt.Sprintf("Rate limit reached for %s; please try again in %ds.", c.tenant, secs))
	case FaultUnavailable:
		secs := s.retryLater(w, c, a)
		writeError(w, http.StatusServiceUnavailable, "server_error", "overloaded",
			fmt.Sprintf("The engine is currently overloaded, please try again in %ds.", secs))
	case FaultErrorBody:
		s.release(a.id)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"error":{"message":"The server had an error processing your request.","type":"server_error","code":null}}`)
	case FaultServerError:
		s.release(a.id)
		writeError(w, http.StatusInternalServerError, "server_error", "", "The server had an error while processing your request. Sorry about that!")
	case FaultReject:
		s.release(a.id)
		writeError(w, http.StatusBadRequest, "invalid_request_error", "content_policy_violation",
			"Your request was rejected as a result of our safety system.")
	case FaultBadBytes:
		s.release(a.id)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("\xff\xfe<html>upstream \x00 error\xc0\xaf</html>"))
	default:
		return false
	}
	return true
}

// retryLater sets the Retry-After of a call's fault (1s by default), holds
// the call's retry key to it and releases the call's slot; it returns the
// whole seconds given.
func (s *Server) retryLater(w http.ResponseWriter, c *call, a admission) int64 {
	ra := a.fault.RetryAfter
	if ra <= 0 {
		ra = time.Second
	}
	given, secs := setRetryAfter(w.Header(), ra)
	s.setNotBefore(c.retryKey(), time.Now().Add(given))
	s.release(a.id)
	return secs
}

// completion is the body of the completion answering c, bent by its fault
// f of the given kind (nil and "" for none), and the usage billed for it.
func (s *Server) completion(c *call, f *Fault, kind string) ([]byte, model.Usage) {
	content, finish := s.content(c, f, kind)
	msg, finish, nullContent := message(content, finish, kind)
	resp := model.ChatResponse{
		ID:      fmt.Sprintf("chatcmpl-sim-%d", s.seq.Add(1)),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   cmpOr(c.req.Model, s.opts.Model),
		Choices: []model.Choice{{Index: 0, Message: msg, FinishReason: finish}},
	}
	if kind == FaultNoChoices {
		resp.Choices = []model.Choice{}
	}
	resp.Usage = usage(c.req.Messages, msg)
	s.addDetails(c, &resp.Usage)
	billed := resp.Usage
	switch kind {
	case FaultRenamed:
		resp.Model += DatedSuffix
	case FaultBadUsage:
		resp.Usage.PromptTokens, resp.Usage.CompletionTokens = -resp.Usage.PromptTokens, 1<<40
		resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	}
	body, _ := json.Marshal(resp)
	if nullContent {
		body = bytes.Replace(body, []byte(`"content":""`), []byte(`"content":null`), 1)
	}
	if kind == FaultTruncated {
		body = body[:len(body)/2]
	}
	return body, billed
}

// content is the text answering c and its finish reason: the answer, cut
// short at max_tokens as a real provider cuts it, or as a huge or length
// fault bends it.
func (s *Server) content(c *call, f *Fault, kind string) (content, finish string) {
	if s.opts.Constant && kind == "" && c.contract == ContractCodeReview {
		content = s.constantReview(c)
	} else {
		c.noise = s.noiseFor(c)
		content = c.answer(kind)
	}
	finish = "stop"
	switch mt := c.req.MaxTokens; {
	case kind == FaultHuge:
		// A misbehaving provider: the valid answer padded far past
		// max_tokens with a summary of the whole change.
		content = huge(content, f.Size)
	case kind == FaultLength:
		content, finish = content[:len(content)/2], "length"
	case mt > 0 && tokens(len(content)) > mt:
		// Like a real provider, stop at max_tokens: the answer is cut
		// short and says so.
		content, finish = content[:mt*4], "length"
	}
	return content, finish
}

// message is the assistant message carrying content, as a refusal, content
// filter or tool calls fault bends it, with its finish reason and whether
// its content is sent as JSON null (a refusal, a tool call), as OpenAI
// sends it.
func message(content, finish, kind string) (model.Message, string, bool) {
	nullContent := false
	msg := model.Message{Role: "assistant", Content: content}
	switch kind {
	case FaultRefusal:
		msg.Content, msg.Refusal, nullContent = "", "I'm sorry, but I can't help with that request.", true
	case FaultContentFilter:
		msg.Content, finish = "", "content_filter"
	case FaultToolCalls:
		args, _ := json.Marshal(content)
		msg.Content, nullContent, finish = "", true, "tool_calls"
		msg.ToolCalls = []json.RawMessage{json.RawMessage(`{"id":"call_sim_1","type":"function","function":{"name":"submit_review","arguments":` + string(args) + `}}`)}
	}
	return msg, finish, nullContent
}

// usage counts the units of a call with the prompt msgs answered by msg:
// its content, refusal and tool calls.
func usage(msgs []model.Message, msg model.Message) model.Usage {
	var u model.Usage
	var prompt int
	for _, m := range msgs {
		prompt += len(m.Content)
	}
	u.PromptTokens = tokens(prompt)
	u.CompletionTokens = tokens(len(msg.Content) + len(msg.Refusal))
	for _, tc := range msg.ToolCalls {
		u.CompletionTokens += tokens(len(tc))
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// huge pads a JSON object answer to size bytes (default 5 MiB) with a
// "summary" property.
func huge(answer string, size int) string {
	if size <= 0 {
		size = 5 << 20
	}
	pad := max(size-len(answer)-len(`,"summary":""`), 0)
	return strings.TrimSuffix(answer, "}") + `,"summary":"` + strings.Repeat("The change looks fine. ", pad/23+1)[:pad] + `"}`
}

// tokens estimates units the way the contract says: ceil(bytes/4).
func tokens(n int) int { return (n + 3) / 4 }

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// sleep waits d unless the request goes away or the server closes; it
// reports whether the call should still be answered.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// prepare validates the request and extracts contract, correlation and
// input; it returns a message for a 400 or "".
func (c *call) prepare() string {
	hasUser := false
	for _, m := range c.req.Messages {
		if m.Role == "user" {
			hasUser = true
		}
	}
	if !hasUser {
		return "messages must include a user message"
	}
	rf := c.req.ResponseFormat
	if rf == nil || rf.JSONSchema == nil {
		return "response_format.json_schema is required"
	}
	c.contract = rf.JSONSchema.Name
	switch c.contract {
	case ContractCodeReview, ContractChangeReview, ContractModeration:
	default:
		return fmt.Sprintf("unknown contract %q in response_format.json_schema.name", c.contract)
	}
	corr, err := model.ParseCorrelation(c.req.Messages)
	if err != nil {
		return "no correlation: " + err.Error()
	}
	c.corr = corr
	c.input = model.Input(c.req.Messages)
	if !c.constant {
		c.injections = findInjections(untrustedText(c.input))
	}
	// The input is a JSON document; anything else is read as the raw diff or
	// text, the way a model would still try to answer.
	var doc struct {
		Diff *string `json:"diff"`
		Text *string `json:"text"`
	}
	ok := json.Unmarshal([]byte(c.input), &doc) == nil
	if c.contract == ContractModeration {
		c.text = c.input
		if ok && doc.Text != nil {
			c.text = *doc.Text
		}
		return ""
	}
	c.diffText = c.input
	if ok && doc.Diff != nil {
		c.diffText = *doc.Diff
	}
	if d, err := diff.Parse(c.diffText); err == nil {
		c.diff = d
	}
	return ""
}

// admission is what admit decided for a call.
type admission struct {
	// refused names the capacity exceeded, "" when the call was admitted.
	refused string
	wait    time.Duration // refused: until capacity frees up
	id      int64         // admitted: the call in inFlight
	fault   *Fault        // admitted: the fault to apply, if any
	latency time.Duration // admitted: to wait before answering
}

// retryKey is what a Retry-After is given to: the work id, or the tenant
// when the correlation has none.
func (c *call) retryKey() string {
	if c.corr.WorkID != "" {
		return "work:" + c.corr.WorkID
	}
	return "tenant:" + c.tenant
}

// admit checks the call against capacity, then picks and consumes the first
// matching fault and counts the call, in one critical section so that
// concurrent calls neither share a token, a slot or a Times slot nor miss
// the counters. A call refused by capacity consumes no fault.
func (s *Server) admit(c *call) admission {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	key := c.retryKey()
	early := s.earlyLocked(key, now)
	lat := s.opts.Latency
	if s.capa != nil {
		wait, refused := s.capa.admit(now, s.inFlight)
		if refused != "" {
			wait = max(1, (wait+time.Millisecond-1)/time.Millisecond) * time.Millisecond
			s.notBeforeLocked(key, now.Add(wait), now)
			s.recordLocked(c.tenant, outcomeThrottled, early)
			return admission{refused: refused, wait: wait}
		}
		lat = s.capa.cfg.Latency.draw(s.capa.rng)
	}
	var chosen *Fault
	for i, f := range s.faults {
		if f.Tenant != "" && f.Tenant != c.tenant {
			continue
		}
		if f.Match != "" && !strings.Contains(c.input, f.Match) {
			continue
		}
		if !c.applicable(f.Kind) {
			continue
		}
		cp := *f
		chosen = &cp
		if f.Times > 0 {
			f.Times--
			if f.Times == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		break
	}
	o := outcomeOK
	switch {
	case chosen == nil:
	case chosen.Kind == FaultRateLimit:
		o = outcomeRateLimited
	default:
		o = outcomeFaulted
	}
	s.recordLocked(c.tenant, o, early)
	end := now.Add(lat)
	switch {
	case chosen == nil:
	case chosen.Kind == FaultHang:
		end = time.Time{}
	case chosen.Kind == FaultLatency:
		end = end.Add(chosen.Latency)
	}
	s.flightID++
	s.inFlight[s.flightID] = end
	return admission{id: s.flightID, fault: chosen, latency: lat}
}

// applicable reports whether a fault kind can be expressed in this call's
// contract; a fault that cannot is skipped and keeps its Times.
func (c *call) applicable(kind string) bool {
	switch kind {
	case FaultWrongChangeID, FaultUngroundedFile:
		return c.contract == ContractCodeReview
	case FaultWrongSchemaVersion:
		return c.contract == ContractCodeReview || c.contract == ContractChangeReview
	case FaultLineOutsideHunk, FaultEvidenceNotInDiff:
		if c.contract != ContractCodeReview {
			return false
		}
		_, _, ok := anchor(c.diff)
		return ok
	case FaultObeyInjection:
		return len(c.injections) > 0
	}
	return true
}

// anchor is the first new-side hunk line with text in a file that still
// exists, from which a grounded finding can be built.
func anchor(d *diff.Diff) (*diff.File, diff.Line, bool) {
	if d == nil {
		return nil, diff.Line{}, false
	}
	for i := range d.Files {
		f := &d.Files[i]
		if f.Deleted || f.Path == "" {
			continue
		}
		for _, h := range f.Hunks {
			for _, l := range h.Lines {
				if l.Kind != diff.Removed && l.NewLine >= 1 && strings.TrimSpace(l.Text) != "" {
					return f, l, true
				}
			}
		}
	}
	return nil, diff.Line{}, false
}

// answer renders the output for the call, bent by a content fault kind.
func (c *call) answer(kind string) string {
	if kind == FaultObeyInjection {
		return c.obey()
	}
	var out any
	switch c.contract {
	case ContractCodeReview:
		cr := ReviewCode(c.diffText, c.corr.SchemaVersion, c.corr.WorkID)
		cr.shape(c.schema(), c.system())
		cr.Findings = keep(c.noise, cr.Findings)
		c.bendCodeReview(&cr, kind)
		out = cr
	case ContractChangeReview:
		ch := ReviewChange(c.diffText, c.corr.SchemaVersion)
		ch.shape(c.system())
		ch.bend(c.noise)
		switch kind {
		case FaultBadEnum:
			ch.Severity = "critical"
		case FaultWrongSchemaVersion:
			ch.SchemaVersion = otherVersion(ch.SchemaVersion)
		}
		out = ch
	default:
		m := Moderate(c.text)
		if strings.Contains(c.system(), DirectiveFlagNothing) {
			m = harmless
		}
		m.bend(c.noise)
		if kind == FaultBadEnum {
			m.Category = "hate"
		}
		out = m
	}
	b, _ := json.Marshal(out)
	switch {
	case kind == FaultExtraProperty:
		b = append(bytes.TrimSuffix(b, []byte("}")), []byte(`,"notes":"I also looked at the surrounding code."}`)...)
	case kind == FaultInvalidJSON:
		return "Sure! Here is what I found in the change:\n" + string(b[:len(b)/2])
	case strings.Contains(c.system(), DirectiveAddNotes):
		b = append(bytes.TrimSuffix(b, []byte("}")), []byte(`,"notes":"I read the whole change before answering."}`)...)
	}
	return string(b)
}

// constantReview is the code review of c's diff as first found, with c's
// change id.
func (s *Server) constantReview(c *call) string {
	v, ok := s.reviews.Load(c.diffText)
	if !ok {
		v, _ = s.reviews.LoadOrStore(c.diffText, ReviewCode(c.diffText, c.corr.SchemaVersion, ""))
	}
	cr := v.(CodeReview)
	cr.SchemaVersion, cr.ChangeID = c.corr.SchemaVersion, c.corr.WorkID
	cr.Findings = slices.Clone(cr.Findings)
	cr.shape(c.schema(), c.system())
	b, _ := json.Marshal(cr)
	return string(b)
}

// schema is the response schema the call asked for.
func (c *call) schema() json.RawMessage {
	if rf := c.req.ResponseFormat; rf != nil && rf.JSONSchema != nil {
		return rf.JSONSchema.Schema
	}
	return nil
}

// system is the text of the call's system messages: the contract's prompt.
func (c *call) system() string {
	var b strings.Builder
	for _, m := range c.req.Messages {
		if m.Role == "system" {
			b.WriteString(m.Content)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func (c *call) bendCodeReview(cr *CodeReview, kind string) {
	// put replaces the first finding, or adds one, with a finding that is
	// wrong in exactly one way.
	put := func(f CodeFinding) {
		if len(cr.Findings) == 0 {
			cr.Findings = append(cr.Findings, f)
		} else {
			cr.Findings[0] = f
		}
	}
	base := CodeFinding{File: "README.md", Line: 1, Severity: SeverityWarning, Summary: "Possible issue in the change.", Evidence: "README"}
	f, l, ok := anchor(c.diff)
	if ok {
		base = CodeFinding{File: f.Path, Line: l.NewLine, Severity: SeverityWarning, Summary: "Possible issue in the change.", Evidence: strings.TrimSpace(l.Text)}
	}
	switch kind {
	case FaultBadEnum:
		if len(cr.Findings) == 0 {
			cr.Findings = append(cr.Findings, base)
		}
		cr.Findings[0].Severity = "critical"
	case FaultWrongChangeID:
		cr.ChangeID = otherID(cr.ChangeID)
	case FaultWrongSchemaVersion:
		cr.SchemaVersion = otherVersion(cr.SchemaVersion)
	case FaultUngroundedFile:
		path := "internal/legacy/unrelated.go"
		for c.diff != nil && c.diff.File(path) != nil {
			path = "x/" + path
		}
		base.File = path
		put(base)
	case FaultLineOutsideHunk:
		end := 0
		for _, h := range f.Hunks {
			end = max(end, h.NewStart+h.NewLines)
		}
		base.Line = end + 100
		put(base)
	case FaultEvidenceNotInDiff:
		ev := "applyLegacyDiscount(order, 0.15) // not part of this change"
		for f.Contains(ev) {
			ev += " again"
		}
		base.Evidence = ev
		put(base)
	}
}

// otherID changes the last character so the id keeps its shape (length and
// alphabet) but is no longer the work id.
func otherID(id string) string {
	if id == "" {
		return "wrong-change-id"
	}
	last := id[len(id)-1]
	repl := byte('0')
	if last >= '0' && last <= '9' {
		repl = '0' + (last-'0'+1)%10
	}
	return id[:len(id)-1] + string(repl)
}

// otherVersion is another schema version of the same form as v, a JSON
// value: a number one higher, or a string whose trailing number is bumped
// ("1.2" → "1.3"), so the value still looks like a version.
func otherVersion(v json.RawMessage) json.RawMessage {
	var n int64
	if err := json.Unmarshal(v, &n); err == nil {
		out, _ := json.Marshal(n + 1)
		return out
	}
	var str string
	_ = json.Unmarshal(v, &str)
	out, _ := json.Marshal(bumpVersion(str))
	return out
}

func bumpVersion(v string) string {
	i := len(v)
	for i > 0 && v[i-1] >= '0' && v[i-1] <= '9' {
		i--
	}
	if i == len(v) {
		return v + "1"
	}
	n, err := strconv.Atoi(v[i:])
	if err != nil {
		return v[:i] + "0"
	}
	return v[:i] + strconv.Itoa(n+1)
}

func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) handleAddFault(w http.ResponseWriter, r *http.Request) {
	var f Fault
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err == nil {
		err = s.AddFault(f)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_fault", err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, f)
}

// apiError is the OpenAI error envelope.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type = msg, typ
	if code != "" {
		e.Error.Code = &code
	}
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
