package model

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"assay.dev/pkg/httpwait"
	"assay.dev/pkg/telemetry"
)

// DefaultMaxBodyBytes caps a response body when Client.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 1 << 20

// Kind classifies a failed call so the caller can decide whether and when to
// retry; the adapter itself never does.
type Kind string

const (
	KindRateLimited Kind = "rate_limited"       // 429
	KindRejected    Kind = "transport_rejected" // 4xx other than 408/429, and other non-2xx answers
	KindTransient   Kind = "transport_error"    // 5xx, 408, connection errors
	KindTimeout     Kind = "timeout"            // ctx deadline or network timeout
	KindMalformed   Kind = "malformed"          // 2xx whose body is not a usable chat.completion
	KindCanceled    Kind = "canceled"           // the caller canceled ctx before its deadline
	// Answers that are not the model's output, told apart before the gate
	// sees anything: each is what it is, never an invalid answer.
	KindRefused   Kind = "refused"          // the model declined (message.refusal)
	KindFiltered  Kind = "content_filtered" // the provider's filter stopped the answer (finish_reason content_filter)
	KindTruncated Kind = "truncated"        // the answer was cut at max_tokens (finish_reason length)
	KindToolCall  Kind = "tool_call"        // the model called a tool instead of answering
)

// Error is the only error type Complete returns. Msg is always assay's
// own words; what the provider said is apart, in Provider, and so is the
// URL asked: Error() tells an operator everything, Public() only what may
// reach a tenant.
type Error struct {
	Kind   Kind
	Status int // HTTP status, 0 when no response was read
	// RetryAfter is the provider's retry hint (retry-after-ms, else
	// Retry-After), 0 if absent.
	RetryAfter time.Duration
	// BodyBytes, on a body over the read cap, is its real size: from
	// Content-Length, else counted while discarding the rest up to
	// MaxDrainBytes; -1 when it is larger still.
	BodyBytes int64
	Msg       string
	// Provider is the provider's own error message, redacted (see Redact)
	// and cut to a short excerpt; "" when it sent none.
	Provider string
	// URL is what was asked, "POST https://host/v1/chat/completions",
	// without query or credentials; "" when no request was made.
	URL string
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	e.head(&b)
	if e.Provider != "" {
		b.WriteString(": the provider says: ")
		b.WriteString(e.Provider)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	if e.URL != "" {
		b.WriteString(" (")
		b.WriteString(e.URL)
		b.WriteString(")")
	}
	return b.String()
}

// Public is the error as a tenant may read it, in an attempt's or a work
// item's reason: its kind, status and assay's own words, never the
// provider's text, an address or the underlying error (which name the
// provider's hosts and may quote what it was sent).
func (e *Error) Public() string {
	var b strings.Builder
	e.head(&b)
	if e.Provider != "" {
		b.WriteString(": the provider's message is in the classifier's log")
	}
	return b.String()
}

// head is the kind, the status and assay's own words.
func (e *Error) head(b *strings.Builder) {
	b.WriteString("model: ")
	b.WriteString(string(e.Kind))
	if e.Status != 0 {
		fmt.Fprintf(b, " (HTTP %d)", e.Status)
	}
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
}

func (e *Error) Unwrap() error { return e.Err }

// Client calls one OpenAI-compatible chat-completions endpoint.
type Client struct {
	// BaseURL is the API's base URL as OpenAI's SDKs take base_url
	// (https://api.openai.com/v1, a gateway's …/openai/v1, …/v1beta/openai/):
	// taken as given, with /chat/completions (and the Batch API's /files
	// and /batches) appended.
	BaseURL string
	// Endpoint, when set, is the chat-completions URL itself, asked as
	// given; BaseURL is then needed only for the Batch API.
	Endpoint string
	APIKey   string
	Model    string
	// HTTP is the client used for requests. nil means a shared client with
	// a pooled transport and no overall timeout: deadlines come from ctx.
	HTTP *http.Client
	// MaxBodyBytes caps the response body read; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BatchURL is the base URL the Batch API (files and batches) is asked
	// at, when it is not BaseURL.
	BatchURL string
	// MaxFileBytes caps a batch output or error file read; 0 means
	// DefaultMaxFileBytes.
	MaxFileBytes int64
	// Provider is who answers at the endpoint, as the OpenTelemetry GenAI
	// conventions name providers (gen_ai.provider.name: "openai",
	// "azure.ai.openai", "gcp.gemini", …); "" is DefaultProvider.
	Provider string
}

// DefaultProvider is the gen_ai.provider.name of an OpenAI-compatible
// endpoint whose provider is not named.
const DefaultProvider = "openai"

// ProviderName is Provider, or DefaultProvider when it is not set.
func (c *Client) ProviderName() string {
	if c.Provider != "" {
		return c.Provider
	}
	return DefaultProvider
}

// Join is path under base, as the OpenAI SDKs join a base URL and a
// route: the base taken as given, one slash between them.
func Join(base, path string) string {
	return strings.TrimRight(base, "/") + "/" + strings.TrimLeft(path, "/")
}

// ChatURL is where Complete posts: Endpoint when set, else BaseURL joined
// with chat/completions.
func (c *Client) ChatURL() string {
	if c.Endpoint != "" {
		return c.Endpoint
	}
	return Join(c.BaseURL, "chat/completions")
}

// asked names a request for an error: the method and the URL without its
// query, fragment or credentials.
func asked(method, raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return method + " (a URL that does not parse)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return method + " " + u.String()
}

// unaddressed is err with the URL of the *url.Error it wraps cut as asked
// cuts it: net/http's keeps a user that stands alone (a token) and the
// query, and url.Parse's the password too.
func unaddressed(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = strings.TrimPrefix(asked("", ue.URL), " ")
	}
	return err
}

// Call is one structured-output request.
type Call struct {
	Tenant   string
	Contract string // json_schema name
	Schema   json.RawMessage
	Messages []Message
	// MaxTokens caps the answer's units (0: the provider's default). The
	// budget reservation counts on it as an upper bound.
	MaxTokens int
	// Model asks another model than the client's (a rollout candidate's);
	// "" asks the client's.
	Model string
}

// Reply is a successful answer, or on error whatever was observed of it.
type Reply struct {
	Content string
	Usage   Usage
	Model   string
	Status  int
	Latency time.Duration
	Raw     []byte // response body, capped at MaxBodyBytes
	// Sent: the whole request reached the connection, so the provider
	// may bill the call even if no answer came back.
	Sent bool
	// ID is the provider's id of its answer ("chatcmpl-…"), and
	// FinishReasons the finish_reason of each choice, in order: "" and nil
	// when no chat.completion was read.
	ID            string
	FinishReasons []string
}

// defaultHTTP is shared so that every Client with a nil HTTP reuses one
// connection pool.
var defaultHTTP = &http.Client{
	Transport: func() http.RoundTripper {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 256
		t.MaxIdleConnsPerHost = 64
		t.IdleConnTimeout = 90 * time.Second
		return t
	}(),
	// A followed redirect would be a second upstream attempt the ledger
	// never sees.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Complete makes exactly one HTTP request. The error, if any, is *Error,
// naming the URL asked; the Reply may then still carry Status, Latency and
// Raw for the ledger.
func (c *Client) Complete(ctx context.Context, call Call) (*Reply, error) {
	endpoint := c.ChatURL()
	rep, e := c.complete(ctx, call, endpoint)
	if e == nil {
		return rep, nil
	}
	e.URL = asked(http.MethodPost, endpoint)
	if e.Status == http.StatusNotFound && e.Kind == KindRejected {
		e.Msg = "nothing answers chat completions at this URL (a base URL is taken as the OpenAI SDKs take it, with /chat/completions appended: most end in /v1)"
	}
	return rep, e
}

func (c *Client) complete(ctx context.Context, call Call, endpoint string) (*Reply, *Error) {
	body, err := c.RequestBody(call)
	if err != nil {
		return nil, &Error{Kind: KindRejected, Msg: "encoding request", Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, &Error{Kind: KindRejected, Msg: "building request", Err: unaddressed(err)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	// The provider's side of the call joins the work's trace.
	telemetry.ToProvider(ctx, req.Header)
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	// net/http may replay the body only when not one byte reached the
	// server (a stale pooled connection), so the provider still sees at most
	// one attempt.

	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	limit := c.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}

	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) { sent.Store(info.Err == nil) },
	}))
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return &Reply{Latency: time.Since(start), Sent: sent.Load()}, transportError(ctx, "sending request", err)
	}
	raw, readErr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	over := int64(len(raw)) > limit
	size := int64(len(raw))
	if over {
		raw = raw[:limit]
		size = bodySize(resp, size, readErr)
	}
	resp.Body.Close()
	rep := &Reply{Status: resp.StatusCode, Latency: time.Since(start), Model: c.Model, Sent: true}
	if call.Model != "" {
		rep.Model = call.Model
	}
	rep.Raw = raw
	if readErr != nil {
		e := transportError(ctx, "reading response", readErr)
		e.Status = resp.StatusCode
		return rep, e
	}

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return rep, statusError(resp, raw, call)
	}
	if over {
		what := fmt.Sprintf("%d bytes", size)
		if size < 0 {
			what = fmt.Sprintf("more than %d bytes", MaxDrainBytes)
		}
		return rep, &Error{Kind: KindMalformed, Status: resp.StatusCode, BodyBytes: size,
			Msg: fmt.Sprintf("response body is %s, over the %d-byte cap", what, limit)}
	}
	if e := decodeAnswer(rep, raw, call.MaxTokens); e != nil {
		return rep, e
	}
	return rep, nil
}

// RequestBody is the chat-completions request body of one call, as
// Complete sends it and as a Batch API line carries it.
func (c *Client) RequestBody(call Call) ([]byte, error) {
	temp := 0.0
	name := c.Model
	if call.Model != "" {
		name = call.Model
	}
	return json.Marshal(ChatRequest{
		Model:    name,
		Messages: call.Messages,
		ResponseFormat: &ResponseFormat{
			Type:       "json_schema",
			JSONSchema: &JSONSchema{Name: call.Contract, Strict: true, Schema: call.Schema},
		},
		User:        call.Tenant,
		Temperature: &temp,
		MaxTokens:   call.MaxTokens,
	})
}

// decodeAnswer reads a 2xx body into rep: its usage, model and content,
// and what it is when it is not the model's answer.
func decodeAnswer(rep *Reply, raw []byte, maxTokens int) *Error {
	var cr ChatResponse
	if err := json.Unmarshal(raw, &cr); err != nil {
		return &Error{Kind: KindMalformed, Status: rep.Status, Msg: "response is not JSON", Err: err}
	}
	rep.Usage, rep.ID = cr.Usage, cr.ID
	if cr.Model != "" {
		rep.Model = cr.Model
	}
	for _, ch := range cr.Choices {
		rep.FinishReasons = append(rep.FinishReasons, ch.FinishReason)
	}
	if len(cr.Choices) > 0 {
		rep.Content = cr.Choices[0].Message.Content
	}
	if e := classify(&cr, maxTokens); e != nil {
		e.Status = rep.Status
		return e
	}
	return nil
}

// classify tells a 2xx chat completion that carries no model output for
// what it is, before anything reaches the gate: a provider fault (an error
// object, no choices) is transient, a refusal, a content filter, a cut
// answer or a tool call are kinds of their own. nil: the content is the
// model's answer. What is said quotes nothing of the provider's text; the
// body is kept with the attempt in the cell.
func classify(cr *ChatResponse, maxTokens int) *Error {
	// Some compatible servers omit "object"; anything else named is not ours.
	if cr.Object != "" && cr.Object != "chat.completion" {
		return &Error{Kind: KindMalformed, Msg: fmt.Sprintf("response object is a %d-byte name, not chat.completion", len(cr.Object))}
	}
	if len(cr.Error) > 0 && string(cr.Error) != "null" {
		return &Error{Kind: KindTransient, Msg: fmt.Sprintf("a 2xx answer carrying an error object (%d bytes) and no answer", len(cr.Error))}
	}
	if len(cr.Choices) == 0 {
		return &Error{Kind: KindTransient, Msg: "a 2xx answer without choices"}
	}
	ch := cr.Choices[0]
	switch {
	case ch.Message.Refusal != "":
		return &Error{Kind: KindRefused, Msg: fmt.Sprintf("the model declined to answer (a %d-byte refusal)", len(ch.Message.Refusal))}
	case ch.FinishReason == "content_filter":
		return &Error{Kind: KindFiltered, Msg: "the provider's content filter stopped the answer"}
	case len(ch.Message.ToolCalls) > 0 && ch.Message.Content == "":
		return &Error{Kind: KindToolCall, Msg: fmt.Sprintf("the model called %d tool(s) instead of answering", len(ch.Message.ToolCalls))}
	case ch.FinishReason == "length":
		return &Error{Kind: KindTruncated, Msg: fmt.Sprintf("the answer was cut at max_tokens %d (%d bytes of it came)", maxTokens, len(ch.Message.Content))}
	}
	return nil
}

// MaxDrainBytes bounds how much of an oversize body is read, and thrown
// away, only to learn its size.
const MaxDrainBytes = 64 << 20

// bodySize is the real size of a body whose first read bytes were read:
// Content-Length when the server sent one, else what the rest counts up to
// MaxDrainBytes (-1 beyond).
func bodySize(resp *http.Response, read int64, readErr error) int64 {
	if resp.ContentLength > 0 {
		return resp.ContentLength
	}
	if readErr != nil {
		return read
	}
	n, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, MaxDrainBytes-read+1))
	if read+n > MaxDrainBytes {
		return -1
	}
	return read + n
}

// transportError classifies a failure to exchange bytes with the provider.
func transportError(ctx context.Context, what string, err error) *Error {
	err = unaddressed(err)
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return &Error{Kind: KindTimeout, Msg: what, Err: cerr}
		}
		return &Error{Kind: KindCanceled, Msg: what, Err: cerr}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Kind: KindTimeout, Msg: what, Err: err}
	}
	if cause := netCause(err); cause != "" {
		what += ": " + cause
	}
	return &Error{Kind: KindTransient, Msg: what, Err: err}
}

// netCause names, in words that carry no address, why bytes could not be
// exchanged: what Public may say of a transport failure.
func netCause(err error) string {
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection was closed"
	case errors.As(err, &dns):
		return "the host name does not resolve"
	case errors.As(err, &cert), errors.As(err, &unknownAuthority), errors.As(err, &hostname):
		return "the server's certificate is not trusted"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the host"
	}
	return ""
}

func statusError(resp *http.Response, raw []byte, call Call) *Error {
	return &Error{Kind: statusKind(resp.StatusCode), Status: resp.StatusCode, Provider: providerMessage(raw, call),
		RetryAfter: RetryAfterHeader(resp.Header, time.Now())}
}

// statusKind is what a non-2xx status means for a retry.
func statusKind(status int) Kind {
	switch {
	case status == http.StatusTooManyRequests:
		return KindRateLimited
	case status == http.StatusRequestTimeout || status >= 500:
		return KindTransient
	}
	return KindRejected
}

// messageExcerpt bounds what a log line carries of a provider's message.
const messageExcerpt = 160

// providerMessage is what may be logged of an error body: the provider's
// own message ({"error":{"message":...}}), redacted, then cut to a short
// excerpt; of a body that is not such an error, only its size. It is
// logged, never shown to a tenant (Error.Public leaves it out). Providers
// quote what they were sent (a content-policy refusal, a schema
// complaint), and a log pipeline carries it out of the cell.
func providerMessage(raw []byte, call Call) string {
	var b struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &b) != nil || b.Error.Message == "" {
		return fmt.Sprintf("a %d-byte body that is not an error object", len(raw))
	}
	var sent strings.Builder
	for _, m := range call.Messages {
		sent.WriteString(m.Content)
	}
	return excerpt(Redact(b.Error.Message, sent.String()), messageExcerpt)
}

// quoted matches text between quotes, which is where providers repeat
// what they were sent.
var quoted = regexp.MustCompile("\"[^\"]*\"|'[^'\\s][^']*'|`[^`]*`|«[^»]*»|“[^”]*”")

// Redact removes from a provider's text what repeats the request: every
// quoted passage, and every word found in sent that reads as code or a
// secret rather than prose (it holds a digit, a symbol or an inner capital,
// or is 12 letters or more). Plain words stay, so the message still says
// why.
func Redact(msg, sent string) string {
	msg = quoted.ReplaceAllString(msg, "[quoted]")
	words := strings.Fields(msg)
	for i, w := range words {
		core := strings.TrimRight(strings.TrimLeft(w, "([{<"), ".,;:!?)]}>")
		if len(core) >= 4 && !plainWord(core) && strings.Contains(sent, core) {
			words[i] = strings.Replace(w, core, "[redacted]", 1)
		}
	}
	return strings.Join(words, " ")
}

// plainWord reports whether w reads as prose: under 12 letters, lower
// case after the first.
func plainWord(w string) bool {
	if utf8.RuneCountInString(w) >= 12 {
		return false
	}
	for i, r := range w {
		if !unicode.IsLetter(r) && r != '\'' || (i > 0 && unicode.IsUpper(r)) {
			return false
		}
	}
	return true
}

// excerpt is s as one line of valid UTF-8 without control characters, cut
// to at most n bytes on a rune boundary.
func excerpt(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// RetryAfterHeader reads a response's retry hint: retry-after-ms (exact
// milliseconds, as OpenAI sends it) when present and positive, otherwise
// Retry-After. It returns 0 when neither gives a usable delay.
func RetryAfterHeader(h http.Header, now time.Time) time.Duration {
	if d := httpwait.RetryAfterMS(h.Get("Retry-After-Ms")); d > 0 {
		return d
	}
	d, _ := httpwait.RetryAfter(h.Get("Retry-After"), now)
	return d
}
