package model

// The OpenAI-compatible Batch API: a JSON-lines file of chat-completions
// requests is uploaded (files under the base URL, purpose "batch"), a batch is created on
// it (batches), polled until it ends, and its output and error files
// are read back. Every line carries a custom_id, and answers are matched to
// requests by it alone: the provider writes them in any order.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
)

// Batch statuses, as the provider names them.
const (
	BatchValidating = "validating"
	BatchFailed     = "failed"
	BatchInProgress = "in_progress"
	BatchFinalizing = "finalizing"
	BatchCompleted  = "completed"
	BatchExpired    = "expired"
	BatchCancelling = "cancelling"
	BatchCancelled  = "cancelled"
)

// BatchEnded reports whether a batch in status will change no more.
func BatchEnded(status string) bool {
	switch status {
	case BatchFailed, BatchCompleted, BatchExpired, BatchCancelled:
		return true
	}
	return false
}

// BatchChatEndpoint is the endpoint a batch of chat completions names.
const BatchChatEndpoint = "/v1/chat/completions"

// ErrorCodeBatchExpired is the error code of a line the batch did not run
// before its completion window ended.
const ErrorCodeBatchExpired = "batch_expired"

// DefaultMaxFileBytes caps a batch output or error file read when
// Client.MaxFileBytes is 0.
const DefaultMaxFileBytes = 256 << 20

// BatchRequestLine is one line of a batch input file.
type BatchRequestLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// BatchOutputLine is one line of a batch output or error file: the
// response the provider gave the request named by CustomID, or the error
// that kept it from one.
type BatchOutputLine struct {
	ID       string         `json:"id"`
	CustomID string         `json:"custom_id"`
	Response *BatchResponse `json:"response"`
	Error    *BatchError    `json:"error"`
}

// BatchResponse is the HTTP response one line got.
type BatchResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// BatchError is an error of a line or of a whole batch.
type BatchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Line    *int   `json:"line,omitempty"`
}

// BatchCounts are the provider's counts of a batch's requests.
type BatchCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// BatchObject is a batch as the provider describes it.
type BatchObject struct {
	ID               string      `json:"id"`
	Object           string      `json:"object"`
	Endpoint         string      `json:"endpoint"`
	InputFileID      string      `json:"input_file_id"`
	CompletionWindow string      `json:"completion_window"`
	Status           string      `json:"status"`
	OutputFileID     string      `json:"output_file_id,omitempty"`
	ErrorFileID      string      `json:"error_file_id,omitempty"`
	CreatedAt        int64       `json:"created_at"`
	RequestCounts    BatchCounts `json:"request_counts"`
	Errors           *struct {
		Data []BatchError `json:"data"`
	} `json:"errors,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// BatchList is a page of batches, newest first.
type BatchList struct {
	Data    []BatchObject `json:"data"`
	HasMore bool          `json:"has_more"`
	LastID  string        `json:"last_id"`
}

// FileObject is an uploaded file.
type FileObject struct {
	ID      string `json:"id"`
	Bytes   int64  `json:"bytes"`
	Purpose string `json:"purpose"`
}

// BatchInput renders request lines as a batch input file.
func BatchInput(lines []BatchRequestLine) ([]byte, error) {
	var b bytes.Buffer
	for _, l := range lines {
		raw, err := json.Marshal(l)
		if err != nil {
			return nil, fmt.Errorf("model: batch line %s: %w", l.CustomID, err)
		}
		b.Write(raw)
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// ParseBatchOutput reads an output or error file. A line that is not JSON
// or names no custom_id cannot be matched to a request, and is counted in
// unreadable instead of guessed at.
func ParseBatchOutput(raw []byte) (lines []BatchOutputLine, unreadable int) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64<<10), len(raw)+1)
	for sc.Scan() {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var l BatchOutputLine
		if err := json.Unmarshal(text, &l); err != nil || l.CustomID == "" {
			unreadable++
			continue
		}
		lines = append(lines, l)
	}
	return lines, unreadable
}

// LineReply reads one output line's response the way Complete reads an
// HTTP answer: a 2xx chat completion is the model's answer or told for what
// it is instead, any other status is the error that status means. request
// is the line's request body, whose text is kept out of error messages.
func LineReply(request []byte, resp BatchResponse) (*Reply, error) {
	var req ChatRequest
	_ = json.Unmarshal(request, &req)
	rep := &Reply{Status: resp.StatusCode, Model: req.Model, Raw: []byte(resp.Body), Sent: true}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return rep, &Error{Kind: statusKind(resp.StatusCode), Status: resp.StatusCode,
			Provider: providerMessage(resp.Body, Call{Messages: req.Messages})}
	}
	if e := decodeAnswer(rep, resp.Body, req.MaxTokens); e != nil {
		return rep, e
	}
	return rep, nil
}

// UploadBatchFile uploads a batch input file (purpose "batch").
func (c *Client) UploadBatchFile(ctx context.Context, name string, content []byte) (FileObject, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if err := mw.WriteField("purpose", "batch"); err != nil {
		return FileObject{}, &Error{Kind: KindRejected, Msg: "building upload", Err: err}
	}
	fw, err := mw.CreateFormFile("file", name)
	if err == nil {
		_, err = fw.Write(content)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return FileObject{}, &Error{Kind: KindRejected, Msg: "building upload", Err: err}
	}
	var f FileObject
	err = c.batchDo(ctx, http.MethodPost, "files", mw.FormDataContentType(), &body, &f)
	return f, err
}

// CreateBatch creates a batch of chat completions on an uploaded file.
// metadata is kept by the provider with the batch and lets a batch whose
// creation went unanswered be found again.
func (c *Client) CreateBatch(ctx context.Context, inputFileID, window string, metadata map[string]string) (BatchObject, error) {
	raw, err := json.Marshal(map[string]any{"input_file_id": inputFileID, "endpoint": BatchChatEndpoint,
		"completion_window": window, "metadata": metadata})
	if err != nil {
		return BatchObject{}, &Error{Kind: KindRejected, Msg: "encoding batch", Err: err}
	}
	var b BatchObject
	err = c.batchDo(ctx, http.MethodPost, "batches", "application/json", bytes.NewReader(raw), &b)
	return b, err
}

// GetBatch reads a batch.
func (c *Client) GetBatch(ctx context.Context, id string) (BatchObject, error) {
	var b BatchObject
	err := c.batchDo(ctx, http.MethodGet, "batches/"+url.PathEscape(id), "", nil, &b)
	return b, err
}

// ListBatches reads one page of batches, newest first, after the batch id
// after ("" for the first page).
func (c *Client) ListBatches(ctx context.Context, after string, limit int) (BatchList, error) {
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	var l BatchList
	err := c.batchDo(ctx, http.MethodGet, "batches?"+q.Encode(), "", nil, &l)
	return l, err
}

// FileContent reads an uploaded or produced file, up to MaxFileBytes.
func (c *Client) FileContent(ctx context.Context, id string) ([]byte, error) {
	resp, err := c.batchRequest(ctx, http.MethodGet, "files/"+url.PathEscape(id)+"/content", "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	limit := c.MaxFileBytes
	if limit <= 0 {
		limit = DefaultMaxFileBytes
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, transportError(ctx, "reading file", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, statusError(resp, raw, Call{})
	}
	if int64(len(raw)) > limit {
		return nil, &Error{Kind: KindMalformed, Status: resp.StatusCode, Msg: fmt.Sprintf("file %s is over the %d-byte cap", id, limit)}
	}
	return raw, nil
}

// DeleteFile deletes an uploaded or produced file at the provider.
func (c *Client) DeleteFile(ctx context.Context, id string) error {
	var out struct {
		Deleted bool `json:"deleted"`
	}
	if err := c.batchDo(ctx, http.MethodDelete, "files/"+url.PathEscape(id), "", nil, &out); err != nil {
		return err
	}
	if !out.Deleted {
		return &Error{Kind: KindMalformed, Msg: "the provider did not say the file was deleted"}
	}
	return nil
}

// batchDo makes one Batch API request and decodes its JSON answer into out.
func (c *Client) batchDo(ctx context.Context, method, path, contentType string, body io.Reader, out any) error {
	resp, err := c.batchRequest(ctx, method, path, contentType, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, DefaultMaxBodyBytes))
	if err != nil {
		return transportError(ctx, "reading response", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return statusError(resp, raw, Call{})
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return &Error{Kind: KindMalformed, Status: resp.StatusCode, Msg: "response is not JSON", Err: err}
	}
	return nil
}

func (c *Client) batchRequest(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	target := Join(c.BatchBaseURL(), path)
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, &Error{Kind: KindRejected, Msg: "building request", Err: unaddressed(err), URL: asked(method, target)}
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		e := transportError(ctx, "sending request", err)
		e.URL = asked(method, target)
		return nil, e
	}
	return resp, nil
}

// BatchBaseURL is where the Batch API is asked: BatchURL when set, else
// BaseURL.
func (c *Client) BatchBaseURL() string {
	if c.BatchURL != "" {
		return c.BatchURL
	}
	return c.BaseURL
}
