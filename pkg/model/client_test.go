package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const okBody = `{"id":"c1","object":"chat.completion","created":1,"model":"m-served",
"choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":1}"},"finish_reason":"stop"}],
"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`

type captured struct {
	header http.Header
	method string
	path   string
	body   []byte
}

type bundle struct {
	srv    *httptest.Server
	client *Client
	calls  *atomic.Int64
	mu     *sync.Mutex
	last   *captured
}

// setup starts a provider that records every request and answers with h.
func setup(t *testing.T, h http.HandlerFunc) bundle {
	t.Helper()
	b := bundle{calls: new(atomic.Int64), mu: new(sync.Mutex), last: new(captured)}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		*b.last = captured{header: r.Header.Clone(), method: r.Method, path: r.URL.Path, body: body}
		b.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(b.srv.Close)
	b.client = &Client{BaseURL: b.srv.URL + "/v1", APIKey: "sk-test", Model: "m-asked"}
	return b
}

func (b bundle) captured() captured {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *b.last
}

func answer(status int, body string, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

var testCall = Call{
	Tenant:   "tenant-1",
	Contract: "review_v1",
	Schema:   json.RawMessage(`{"type":"object"}`),
	Messages: []Message{{Role: "system", Content: "do it"}, {Role: "user", Content: "input"}},
}

func asError(t *testing.T, err error) *Error {
	t.Helper()
	if err == nil {
		t.Fatal("expected an error, got nil")
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("error %T %v is not *model.Error", err, err)
	}
	return me
}

func TestCompleteSuccessSendsRequestShape(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(200, okBody))

	rep, err := b.client.Complete(context.Background(), testCall)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rep.Content != `{"a":1}` || rep.Model != "m-served" || rep.Status != 200 {
		t.Fatalf("reply = %+v", rep)
	}
	if rep.Usage != (Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}) {
		t.Fatalf("usage = %+v", rep.Usage)
	}
	if rep.Latency <= 0 || string(rep.Raw) != okBody {
		t.Fatalf("latency %v raw %q", rep.Latency, rep.Raw)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("requests = %d, want 1", n)
	}

	got := b.captured()
	if got.method != http.MethodPost || got.path != "/v1/chat/completions" {
		t.Fatalf("request %s %s", got.method, got.path)
	}
	if h := got.header.Get("Authorization"); h != "Bearer sk-test" {
		t.Fatalf("Authorization = %q", h)
	}
	if h := got.header.Get("Content-Type"); h != "application/json" {
		t.Fatalf("Content-Type = %q", h)
	}
	var req ChatRequest
	if err := json.Unmarshal(got.body, &req); err != nil {
		t.Fatalf("request body: %v", err)
	}
	if req.Model != "m-asked" || req.User != "tenant-1" || len(req.Messages) != 2 || req.Messages[1].Content != testCall.Messages[1].Content {
		t.Fatalf("request = %+v", req)
	}
	rf := req.ResponseFormat
	if rf == nil || rf.Type != "json_schema" || rf.JSONSchema == nil || rf.JSONSchema.Name != "review_v1" || !rf.JSONSchema.Strict || string(rf.JSONSchema.Schema) != `{"type":"object"}` {
		t.Fatalf("response_format = %+v / %+v", rf, rf.JSONSchema)
	}
	// Temperature 0 must be on the wire, not omitted.
	var rawReq map[string]json.RawMessage
	json.Unmarshal(got.body, &rawReq)
	if string(rawReq["temperature"]) != "0" {
		t.Fatalf("temperature = %s", rawReq["temperature"])
	}
}

func TestCompleteOmitsAuthorizationWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(200, okBody))
	b.client.APIKey = ""
	b.client.BaseURL += "/" // a trailing slash must not double up
	if _, err := b.client.Complete(context.Background(), testCall); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	got := b.captured()
	if _, ok := got.header["Authorization"]; ok {
		t.Fatalf("Authorization sent: %q", got.header.Get("Authorization"))
	}
	if got.path != "/v1/chat/completions" {
		t.Fatalf("path = %q", got.path)
	}
}

func TestCompleteStatusKindsOneRequestEach(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		h          http.HandlerFunc
		kind       Kind
		retryAfter time.Duration
	}{
		{"429 seconds", answer(429, `{"error":{"message":"slow down"}}`, "Retry-After", "7"), KindRateLimited, 7 * time.Second},
		{"429 no header", answer(429, `{}`), KindRateLimited, 0},
		{"500", answer(500, `oops`), KindTransient, 0},
		{"503 retry-after", answer(503, `{}`, "Retry-After", "2"), KindTransient, 2 * time.Second},
		{"408", answer(408, `{}`), KindTransient, 0},
		{"400", answer(400, `{"error":{"message":"bad schema"}}`), KindRejected, 0},
		{"401", answer(401, `{}`), KindRejected, 0},
		{"404", answer(404, `{}`), KindRejected, 0},
		{"307 not followed", answer(307, ``, "Location", "/elsewhere"), KindRejected, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.h)
			rep, err := b.client.Complete(context.Background(), testCall)
			e := asError(t, err)
			if e.Kind != tc.kind || e.RetryAfter != tc.retryAfter {
				t.Fatalf("got kind %q retryAfter %v, want %q %v (%v)", e.Kind, e.RetryAfter, tc.kind, tc.retryAfter, e)
			}
			if n := b.calls.Load(); n != 1 {
				t.Fatalf("requests = %d, want exactly 1", n)
			}
			if rep == nil || rep.Status != e.Status || e.Status == 0 || rep.Latency <= 0 {
				t.Fatalf("reply %+v, error status %d", rep, e.Status)
			}
		})
	}
}

func TestCompleteErrorCarriesProviderMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(400, `{"error":{"message":"schema is not strict"}}`))
	_, err := b.client.Complete(context.Background(), testCall)
	if e := asError(t, err); !strings.Contains(e.Error(), "schema is not strict") || !strings.Contains(e.Error(), "400") {
		t.Fatalf("Error() = %q", e.Error())
	}
}

// A provider that repeats what it was sent does not carry it into the
// error: quoted passages and code-like words of the request are redacted
// before the message is cut short, and a body that is not an error object
// is told by its size alone.
func TestCompleteErrorRedactsWhatTheRequestSaid(t *testing.T) {
	t.Parallel()
	const secret = "CUSTOMER-SECRET-hunter2"
	call := testCall
	call.Messages = []Message{{Role: "system", Content: "do it"},
		{Role: "user", Content: `{"diff":"+const dbPassword = \"` + secret + `\"\n+token := hunter2x9"}`}}
	for name, c := range map[string]struct {
		status      int
		body, keep  string
		contentType string
	}{
		"quoted":     {400, `{"error":{"message":"Invalid content: \"const dbPassword = ` + secret + `\" was flagged by our safety system"}}`, "was flagged by our safety system", "application/json"},
		"unquoted":   {400, `{"error":{"message":"Your request mentions ` + secret + ` and dbPassword and hunter2x9; it was rejected"}}`, "Your request mentions [redacted] and [redacted] and [redacted]; it was rejected", "application/json"},
		"not json":   {502, `<html><body>upstream echoed: const dbPassword = "` + secret + `"</body></html>`, "body that is not an error object", "text/html"},
		"long prose": {400, `{"error":{"message":"` + strings.Repeat("the request was too long for this model ", 20) + secret + `"}}`, "the request was too long", "application/json"},
	} {
		b := setup(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", c.contentType)
			w.WriteHeader(c.status)
			io.WriteString(w, c.body)
		})
		_, err := b.client.Complete(context.Background(), call)
		msg := asError(t, err).Error()
		if strings.Contains(msg, secret) || strings.Contains(msg, "hunter2") || strings.Contains(msg, "dbPassword") {
			t.Errorf("%s: the error repeats the request: %q", name, msg)
		}
		if !strings.Contains(msg, c.keep) || len(msg) > 60+messageExcerpt+len(" (POST "+b.client.ChatURL()+")") {
			t.Errorf("%s: Error() = %q, want it to keep %q within an excerpt", name, msg, c.keep)
		}
	}
}

func TestCompleteRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	b := setup(t, answer(429, `{}`, "Retry-After", at))
	_, err := b.client.Complete(context.Background(), testCall)
	e := asError(t, err)
	// HTTP-dates have one-second resolution, so the hint lands within a
	// second below two minutes.
	if e.Kind != KindRateLimited || e.RetryAfter <= time.Minute || e.RetryAfter > 2*time.Minute {
		t.Fatalf("kind %q retryAfter %v", e.Kind, e.RetryAfter)
	}
}

func TestRetryAfterHeaderPrefersMilliseconds(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	cases := []struct {
		h    http.Header
		want time.Duration
	}{
		{hdr(), 0},
		{hdr("Retry-After", "2"), 2 * time.Second},
		{hdr("retry-after-ms", "1250"), 1250 * time.Millisecond},
		{hdr("Retry-After", "2", "retry-after-ms", "1250"), 1250 * time.Millisecond},
		{hdr("Retry-After", "2", "retry-after-ms", "soon"), 2 * time.Second},
		{hdr("Retry-After", "2", "retry-after-ms", "0"), 2 * time.Second},
		{hdr("Retry-After", "Sun, 01 Mar 2026 12:00:30 GMT", "retry-after-ms", "40"), 40 * time.Millisecond},
	}
	for i, c := range cases {
		if got := RetryAfterHeader(c.h, now); got != c.want {
			t.Errorf("case %d %v: got %v, want %v", i, c.h, got, c.want)
		}
	}
}

func TestCompleteRetryAfterMSPreferred(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(429, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`,
		"Retry-After", "1", "retry-after-ms", "334"))
	_, err := b.client.Complete(context.Background(), testCall)
	e := asError(t, err)
	if e.Kind != KindRateLimited || e.RetryAfter != 334*time.Millisecond || e.Provider != "slow down" {
		t.Fatalf("kind %q retryAfter %v provider %q", e.Kind, e.RetryAfter, e.Provider)
	}
}

func TestCompleteMalformed(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"not json":  `<html>hello</html>`,
		"truncated": okBody[:40],
		"not chat":  `{"object":"list","data":[]}`,
		"empty":     ``,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, answer(200, body))
			rep, err := b.client.Complete(context.Background(), testCall)
			if e := asError(t, err); e.Kind != KindMalformed || e.Status != 200 {
				t.Fatalf("got %v", e)
			}
			if rep == nil || string(rep.Raw) != body {
				t.Fatalf("reply %+v", rep)
			}
		})
	}
}

// A 2xx that carries no model output is told for what it is, with the
// body kept and the usage read, before anything reaches the gate.
func TestCompleteTellsAnswersThatAreNotOutput(t *testing.T) {
	t.Parallel()
	const usage = `"usage":{"prompt_tokens":30,"completion_tokens":5,"total_tokens":35}`
	choice := func(msg, finish string) string {
		return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":` + msg + `,"finish_reason":"` + finish + `"}],` + usage + `}`
	}
	cases := map[string]struct {
		body string
		kind Kind
	}{
		"no choices":     {`{"id":"x","object":"chat.completion","choices":[],` + usage + `}`, KindTransient},
		"error object":   {`{"error":{"message":"The server had an error","type":"server_error"}}`, KindTransient},
		"refusal":        {choice(`{"role":"assistant","content":null,"refusal":"I can't help with that."}`, "stop"), KindRefused},
		"content filter": {choice(`{"role":"assistant","content":""}`, "content_filter"), KindFiltered},
		"tool call":      {choice(`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}`, "tool_calls"), KindToolCall},
		"cut at the cap": {choice(`{"role":"assistant","content":"{\"changeId\":\"w"}`, "length"), KindTruncated},
	}
	for name, c := range cases {
		b := setup(t, answer(200, c.body))
		call := testCall
		call.MaxTokens = 512
		rep, err := b.client.Complete(context.Background(), call)
		e := asError(t, err)
		if e.Kind != c.kind || e.Status != 200 || rep == nil || string(rep.Raw) != c.body {
			t.Errorf("%s: %v (kind %s), reply %+v; want kind %s with the body kept", name, e, e.Kind, rep, c.kind)
			continue
		}
		if name != "error object" && rep.Usage.PromptTokens != 30 {
			t.Errorf("%s: usage %+v not read", name, rep.Usage)
		}
		if strings.Contains(e.Error(), "can't help") || strings.Contains(e.Error(), "server had an error") {
			t.Errorf("%s: the error quotes the provider: %q", name, e.Error())
		}
	}
	// A tool call beside real content is an answer.
	b := setup(t, answer(200, choice(`{"role":"assistant","content":"{\"a\":1}","tool_calls":[{"id":"c"}]}`, "stop")))
	if rep, err := b.client.Complete(context.Background(), testCall); err != nil || rep.Content != `{"a":1}` {
		t.Errorf("content with a tool call: %v, %+v", err, rep)
	}
}

func TestCompleteBodyCap(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(200, okBody))
	b.client.MaxBodyBytes = 64
	rep, err := b.client.Complete(context.Background(), testCall)
	if e := asError(t, err); e.Kind != KindMalformed {
		t.Fatalf("got %v", e)
	}
	if rep == nil || len(rep.Raw) != 64 || string(rep.Raw) != okBody[:64] {
		t.Fatalf("raw = %q", rep.Raw)
	}

	// The default cap is 1 MiB; the error gives the body's real size.
	big := strings.Repeat("x", DefaultMaxBodyBytes+10)
	b2 := setup(t, answer(200, big))
	rep, err = b2.client.Complete(context.Background(), testCall)
	if e := asError(t, err); e.Kind != KindMalformed || e.BodyBytes != int64(len(big)) ||
		!strings.Contains(e.Msg, fmt.Sprintf("%d bytes, over the %d-byte cap", len(big), DefaultMaxBodyBytes)) {
		t.Fatalf("got %v (body %d bytes)", e, e.BodyBytes)
	}
	if len(rep.Raw) != DefaultMaxBodyBytes {
		t.Fatalf("raw len = %d", len(rep.Raw))
	}
}

// Without a Content-Length the rest of an oversize body is counted, not
// kept, to give its size; beyond MaxDrainBytes the size is unknown (-1).
func TestOversizeBodyCountedWithoutContentLength(t *testing.T) {
	t.Parallel()
	for _, n := range []int{5 << 20, MaxDrainBytes + 10} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			chunk := strings.Repeat("y", 64<<10)
			for sent := 0; sent < n; sent += len(chunk) {
				if _, err := io.WriteString(w, chunk[:min(len(chunk), n-sent)]); err != nil {
					return
				}
				w.(http.Flusher).Flush() // chunked: no Content-Length
			}
		}))
		c := &Client{BaseURL: srv.URL, Model: "m"}
		rep, err := c.Complete(context.Background(), testCall)
		srv.Close()
		e := asError(t, err)
		want := int64(n)
		if n > MaxDrainBytes {
			want = -1
		}
		if e.Kind != KindMalformed || e.BodyBytes != want || len(rep.Raw) != DefaultMaxBodyBytes {
			t.Fatalf("%d bytes: %v, size %d, raw %d", n, e, e.BodyBytes, len(rep.Raw))
		}
	}
}

// hang blocks until the client goes away, telling the test it has the request.
func hang(started chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	}
}

// passedWhen is a context whose deadline passes when its channel closes:
// the test sets it to pass once the server holds the request, which a
// timer cannot promise on a loaded machine (at 50ms, and then 500ms, the
// request sometimes had not arrived, and nothing was counted).
type passedWhen struct {
	context.Context
	passed chan struct{}
}

func (c passedWhen) Done() <-chan struct{} { return c.passed }

func (c passedWhen) Err() error {
	select {
	case <-c.passed:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestCompleteDeadlineIsTimeout(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	b := setup(t, hang(started))
	ctx := passedWhen{context.Background(), make(chan struct{})}
	go func() {
		select {
		case <-started:
		case <-time.After(30 * time.Second): // then no request was counted
		}
		close(ctx.passed)
	}()
	rep, err := b.client.Complete(ctx, testCall)
	e := asError(t, err)
	if e.Kind != KindTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", e)
	}
	if rep == nil || rep.Latency <= 0 {
		t.Fatalf("reply %+v", rep)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("requests = %d", n)
	}
}

func TestCompleteCallerCancel(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	b := setup(t, hang(started))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err := b.client.Complete(ctx, testCall)
	e := asError(t, err)
	if e.Kind != KindCanceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", e)
	}
}

func TestCompleteNetTimeoutIsTimeout(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	b := setup(t, hang(started))
	b.client.HTTP = &http.Client{Timeout: 50 * time.Millisecond}
	_, err := b.client.Complete(context.Background(), testCall)
	if e := asError(t, err); e.Kind != KindTimeout {
		t.Fatalf("got %v", e)
	}
}

func TestCompleteConnectionErrors(t *testing.T) {
	t.Parallel()
	t.Run("dropped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		})
		rep, err := b.client.Complete(context.Background(), testCall)
		if e := asError(t, err); e.Kind != KindTransient || e.Status != 0 {
			t.Fatalf("got %v", e)
		}
		if rep == nil || rep.Status != 0 {
			t.Fatalf("reply %+v", rep)
		}
		if n := b.calls.Load(); n != 1 {
			t.Fatalf("requests = %d, want 1", n)
		}
	})
	t.Run("body cut short", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(okBody)))
			w.WriteHeader(200)
			io.WriteString(w, okBody[:20])
			http.NewResponseController(w).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		})
		_, err := b.client.Complete(context.Background(), testCall)
		if e := asError(t, err); e.Kind != KindTransient || e.Status != 200 {
			t.Fatalf("got %v", e)
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		c := &Client{BaseURL: url}
		_, err := c.Complete(context.Background(), testCall)
		e := asError(t, err)
		if e.Kind != KindTransient {
			t.Fatalf("got %v", e)
		}
		// A tenant learns why, not where.
		if pub := e.Public(); !strings.Contains(pub, "connection refused") || strings.Contains(pub, "127.0.0.1") {
			t.Errorf("Public() = %q, want the cause without the address", pub)
		}
	})
}

// A failed exchange names the URL asked without the credentials a URL may
// carry: net/http's own error keeps a lone user (a token) and the query,
// which the operator's log must not.
func TestTransportErrorCarriesNoCredential(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	host := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	for _, c := range []*Client{{BaseURL: "http://t0ken-user@" + host + "/v1"}, {Endpoint: "http://" + host + "/chat?api_key=k3y-param"},
		{BatchURL: "http://t0ken-user@" + host + "/v1?api_key=k3y-param"}} {
		var err error
		if c.BatchURL != "" {
			_, err = c.batchRequest(context.Background(), http.MethodGet, "batches", "", nil)
		} else {
			_, err = c.Complete(context.Background(), testCall)
		}
		msg := asError(t, err).Error()
		if strings.Contains(msg, "t0ken-user") || strings.Contains(msg, "k3y-param") || !strings.Contains(msg, host) {
			t.Errorf("Error() = %q: want where it asked, without the token or the query", msg)
		}
	}
}

func TestCompleteBadBaseURL(t *testing.T) {
	t.Parallel()
	c := &Client{BaseURL: "http://bad host"}
	rep, err := c.Complete(context.Background(), testCall)
	if e := asError(t, err); e.Kind != KindRejected || rep != nil {
		t.Fatalf("got %v, %+v", e, rep)
	}
}

// FuzzCompleteResponse feeds arbitrary provider bodies through the decoder:
// every outcome of a 200 is a reply with content, a malformed error, or one
// of the kinds of answer that is not output, with the body kept.
func FuzzCompleteResponse(f *testing.F) {
	f.Add([]byte(okBody))
	f.Add([]byte(`{"choices":[{}]}`))
	f.Add([]byte(`{"object":"chat.completion","choices":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte("\x00\xff"))
	var body atomic.Pointer[[]byte]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(*body.Load())
	}))
	defer srv.Close()
	c := &Client{BaseURL: srv.URL, MaxBodyBytes: 4096}
	f.Fuzz(func(t *testing.T, b []byte) {
		body.Store(&b)
		rep, err := c.Complete(context.Background(), testCall)
		if err != nil {
			switch e := asError(t, err); e.Kind {
			case KindMalformed, KindTransient, KindRefused, KindFiltered, KindTruncated, KindToolCall:
				if e.Kind != KindMalformed && (rep == nil || !bytes.Equal(rep.Raw, b)) {
					t.Fatalf("kind %q without the body kept", e.Kind)
				}
			default:
				t.Fatalf("kind %q for body %q", e.Kind, b)
			}
			return
		}
		if rep.Status != 200 {
			t.Fatalf("status %d", rep.Status)
		}
	})
}

// The base URL is taken as OpenAI's SDKs take base_url: as given, with
// /chat/completions appended, so the forms their users write reach the
// provider; a full endpoint goes in Endpoint and is asked as given.
func TestChatURLTakesTheBaseAsTheSDKsDo(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		answer(200, okBody)(w, r)
	}))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		client Client
		want   string
	}{
		{Client{BaseURL: srv.URL + "/v1"}, "/v1/chat/completions"},
		{Client{BaseURL: srv.URL + "/v1/"}, "/v1/chat/completions"},
		{Client{BaseURL: srv.URL + "/openai/v1"}, "/openai/v1/chat/completions"},
		{Client{BaseURL: srv.URL + "/v1beta/openai/"}, "/v1beta/openai/chat/completions"},
		{Client{BaseURL: srv.URL}, "/chat/completions"},
		{Client{Endpoint: srv.URL + "/v1/chat/completions"}, "/v1/chat/completions"},
		{Client{Endpoint: srv.URL + "/deployments/m/chat/completions", BaseURL: srv.URL + "/elsewhere"}, "/deployments/m/chat/completions"},
	} {
		mu.Lock()
		paths = nil
		mu.Unlock()
		c.client.Model = "m"
		if _, err := c.client.Complete(context.Background(), testCall); err != nil {
			t.Errorf("base %q endpoint %q: %v", c.client.BaseURL, c.client.Endpoint, err)
		}
		mu.Lock()
		got := strings.Join(paths, ",")
		mu.Unlock()
		if got != c.want {
			t.Errorf("base %q endpoint %q posted to %q, want %q", c.client.BaseURL, c.client.Endpoint, got, c.want)
		}
	}
}

// A URL nothing answers at is named in the error, with the rule that made
// it; what reaches a tenant (Public) names neither the URL nor anything
// the provider said.
func TestCompleteErrorNamesTheURLAskedAndKeepsItFromTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, answer(404, `{"error":{"message":"Unknown route for deployment gw-internal-7"}}`))
	// A full endpoint given as the base URL.
	b.client.BaseURL = b.srv.URL + "/v1/chat/completions"
	_, err := b.client.Complete(context.Background(), testCall)
	e := asError(t, err)
	want := "POST " + b.srv.URL + "/v1/chat/completions/chat/completions"
	if !strings.Contains(e.Error(), want+")") || !strings.Contains(e.Error(), "/chat/completions appended") ||
		!strings.Contains(e.Error(), "Unknown route") {
		t.Errorf("Error() = %q, want the URL asked (%s), the rule and the provider's message", e.Error(), want)
	}
	q := &Client{Endpoint: b.srv.URL + "/openai/deployments/m/chat/completions?api-version=2024-10-21", Model: "m"}
	_, qerr := q.Complete(context.Background(), testCall)
	if msg := asError(t, qerr).Error(); strings.Contains(msg, "api-version") || !strings.Contains(msg, "/openai/deployments/m/chat/completions)") {
		t.Errorf("Error() = %q: want the endpoint asked, without its query", msg)
	}
	pub := e.Public()
	for _, leak := range []string{b.srv.URL, "Unknown route", "gw-internal"} {
		if strings.Contains(pub, leak) {
			t.Errorf("Public() = %q carries %q", pub, leak)
		}
	}
	if !strings.Contains(pub, "HTTP 404") || !strings.Contains(pub, "transport_rejected") {
		t.Errorf("Public() = %q, want the kind and status", pub)
	}
}
