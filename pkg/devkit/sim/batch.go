package sim

// The simulated provider's Batch API: files are uploaded with purpose
// "batch", a batch is created on one, and each poll of the batch moves it
// one step (validating, in_progress, finalizing, then its end), so a
// poller sees every status without any clock. The lines run through the
// same chat handler a direct call does, faults and counts included, and
// batch faults bend what the batch gives back: lines out of order, a
// missing line, an expired or failed batch, a creation whose answer is
// lost.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"assay.dev/pkg/model"
)

// Batch fault kinds.
const (
	// BatchOutOfOrder writes the output lines in the reverse of the input
	// order.
	BatchOutOfOrder = "out_of_order"
	// BatchMissingLine leaves the lines whose request contains Match out
	// of both the output and the error file.
	BatchMissingLine = "missing_line"
	// BatchExpire ends the batch expired: the lines whose request contains
	// Match (every line when Match is empty) do not run and are written to
	// the error file with code batch_expired; the others run.
	BatchExpire = "expire"
	// BatchFail fails the batch's validation: no line runs.
	BatchFail = "fail"
	// BatchLostCreate creates the batch and answers its creation 500, as
	// if the answer were lost on the way.
	BatchLostCreate = "lost_create"
)

// BatchFault bends the next Times batches created (0: every batch).
type BatchFault struct {
	Kind  string `json:"kind"`
	Match string `json:"match,omitempty"`
	Times int    `json:"times,omitempty"`
}

// BatchStats count the Batch API's use.
type BatchStats struct {
	Files   int `json:"files"`
	Batches int `json:"batches"`
	// Lines counts the lines run, each also counted as a call in Stats.
	Lines int `json:"lines"`
	Polls int `json:"polls"`
	// Held counts the files the provider holds now, uploaded or produced.
	Held int `json:"held"`
}

type simFile struct {
	obj     model.FileObject
	content []byte
}

type simBatch struct {
	obj    model.BatchObject
	lines  []model.BatchRequestLine
	faults []BatchFault
	// steps counts the polls that moved it.
	steps int
}

// batches is the Batch API's state.
type batches struct {
	mu      sync.Mutex
	seq     int
	files   map[string]*simFile
	batches map[string]*simBatch
	order   []string // batch ids, oldest first
	faults  []BatchFault
	stats   BatchStats
}

func newBatches() *batches {
	return &batches{files: map[string]*simFile{}, batches: map[string]*simBatch{}}
}

func (s *Server) routeBatches() {
	s.mux.HandleFunc("POST /v1/files", s.handleUpload)
	s.mux.HandleFunc("GET /v1/files/{id}/content", s.handleFileContent)
	s.mux.HandleFunc("DELETE /v1/files/{id}", s.handleDeleteFile)
	s.mux.HandleFunc("POST /v1/batches", s.handleCreateBatch)
	s.mux.HandleFunc("GET /v1/batches", s.handleListBatches)
	s.mux.HandleFunc("GET /v1/batches/{id}", s.handleGetBatch)
	s.mux.HandleFunc("POST /sim/batch-faults", func(w http.ResponseWriter, r *http.Request) {
		var f BatchFault
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err == nil {
			// Strictly: a misspelt "times" would bend every batch.
			err = decodeFields("batch fault", "kind, match, times", b, &f)
		}
		if err == nil {
			err = s.AddBatchFault(f)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_fault", err.Error())
			return
		}
		writeJSON(w, http.StatusCreated, f)
	})
	s.mux.HandleFunc("GET /sim/batch-stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.BatchStats())
	})
}

// AddBatchFault bends the batches created from now on.
func (s *Server) AddBatchFault(f BatchFault) error {
	switch f.Kind {
	case BatchOutOfOrder, BatchMissingLine, BatchExpire, BatchFail, BatchLostCreate:
	default:
		return fmt.Errorf("sim: unknown batch fault kind %q", f.Kind)
	}
	if f.Times < 0 {
		return errors.New("sim: batch fault times must not be negative")
	}
	s.bat.mu.Lock()
	s.bat.faults = append(s.bat.faults, f)
	s.bat.mu.Unlock()
	return nil
}

// BatchStats returns the Batch API's counts.
func (s *Server) BatchStats() BatchStats {
	s.bat.mu.Lock()
	defer s.bat.mu.Unlock()
	st := s.bat.stats
	st.Held = len(s.bat.files)
	return st
}

// Batch returns a batch as the provider describes it.
func (s *Server) Batch(id string) (model.BatchObject, bool) {
	s.bat.mu.Lock()
	defer s.bat.mu.Unlock()
	b, ok := s.bat.batches[id]
	if !ok {
		return model.BatchObject{}, false
	}
	return b.obj, true
}

func (b *batches) nextID(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s-sim-%d", prefix, b.seq)
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseMultipartForm(maxBody); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "could not read the upload: "+err.Error())
		return
	}
	if p := r.FormValue("purpose"); p != "batch" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_purpose", fmt.Sprintf("purpose %q is not batch", p))
		return
	}
	f, _, err := r.FormFile("file")
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_file", "no file in the upload")
		return
	}
	content, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "could not read the file")
		return
	}
	s.bat.mu.Lock()
	sf := &simFile{obj: model.FileObject{ID: s.bat.nextID("file"), Bytes: int64(len(content)), Purpose: "batch"}, content: content}
	s.bat.files[sf.obj.ID] = sf
	s.bat.stats.Files++
	s.bat.mu.Unlock()
	writeJSON(w, http.StatusOK, sf.obj)
}

func (s *Server) handleFileContent(w http.ResponseWriter, r *http.Request) {
	s.bat.mu.Lock()
	f, ok := s.bat.files[r.PathValue("id")]
	s.bat.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no such file")
		return
	}
	w.Header().Set("Content-Type", "application/jsonl")
	_, _ = w.Write(f.content)
}

func (s *Server) handleDeleteFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.bat.mu.Lock()
	_, ok := s.bat.files[id]
	delete(s.bat.files, id)
	s.bat.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no such file")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}

func (s *Server) handleCreateBatch(w http.ResponseWriter, r *http.Request) {
	var req struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "could not decode the request body")
		return
	}
	if req.Endpoint != model.BatchChatEndpoint {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_endpoint", fmt.Sprintf("endpoint %q is not supported", req.Endpoint))
		return
	}
	s.bat.mu.Lock()
	f, ok := s.bat.files[req.InputFileID]
	if !ok {
		s.bat.mu.Unlock()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_file", "no such input file")
		return
	}
	b := &simBatch{obj: model.BatchObject{ID: s.bat.nextID("batch"), Object: "batch", Endpoint: req.Endpoint,
		InputFileID: f.obj.ID, CompletionWindow: req.CompletionWindow, Status: model.BatchValidating,
		CreatedAt: time.Now().Unix(), Metadata: req.Metadata}}
	var invalid string
	b.lines, invalid = parseInput(f.content)
	b.obj.RequestCounts.Total = len(b.lines)
	if invalid != "" {
		b.faults = append(b.faults, BatchFault{Kind: BatchFail, Match: invalid})
	}
	lost := false
	for i := 0; i < len(s.bat.faults); i++ {
		bf := &s.bat.faults[i]
		b.faults = append(b.faults, *bf)
		lost = lost || bf.Kind == BatchLostCreate
		if bf.Times > 0 {
			if bf.Times--; bf.Times == 0 {
				s.bat.faults = slices.Delete(s.bat.faults, i, i+1)
				i--
			}
		}
	}
	s.bat.batches[b.obj.ID] = b
	s.bat.order = append(s.bat.order, b.obj.ID)
	s.bat.stats.Batches++
	obj := b.obj
	s.bat.mu.Unlock()
	if lost {
		writeError(w, http.StatusInternalServerError, "server_error", "", "The server had an error while processing your request. Sorry about that!")
		return
	}
	writeJSON(w, http.StatusOK, obj)
}

// parseInput reads a batch input file; invalid says why it fails
// validation, "" when it does not.
func parseInput(raw []byte) (lines []model.BatchRequestLine, invalid string) {
	seen := map[string]bool{}
	for i, text := range bytes.Split(raw, []byte("\n")) {
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		var l model.BatchRequestLine
		if err := json.Unmarshal(text, &l); err != nil {
			return nil, fmt.Sprintf("line %d is not JSON", i+1)
		}
		switch {
		case l.CustomID == "":
			return nil, fmt.Sprintf("line %d has no custom_id", i+1)
		case seen[l.CustomID]:
			return nil, fmt.Sprintf("line %d repeats a custom_id", i+1)
		case l.Method != http.MethodPost || l.URL != model.BatchChatEndpoint:
			return nil, fmt.Sprintf("line %d is not a POST to %s", i+1, model.BatchChatEndpoint)
		}
		seen[l.CustomID] = true
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return nil, "the file has no requests"
	}
	return lines, ""
}

func (s *Server) handleListBatches(w http.ResponseWriter, r *http.Request) {
	limit, err := strconv.Atoi(cmpOr(r.URL.Query().Get("limit"), "20"))
	if err != nil || limit < 1 || limit > 100 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_limit", "limit must be 1 to 100")
		return
	}
	after := r.URL.Query().Get("after")
	s.bat.mu.Lock()
	var page model.BatchList
	started := after == ""
	for i := len(s.bat.order) - 1; i >= 0; i-- {
		id := s.bat.order[i]
		if !started {
			started = id == after
			continue
		}
		if len(page.Data) == limit {
			page.HasMore = true
			break
		}
		page.Data = append(page.Data, s.bat.batches[id].obj)
		page.LastID = id
	}
	s.bat.mu.Unlock()
	if page.Data == nil {
		page.Data = []model.BatchObject{}
	}
	writeJSON(w, http.StatusOK, page)
}

// handleGetBatch answers a poll, moving the batch one step first.
func (s *Server) handleGetBatch(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.bat.mu.Lock()
	b, ok := s.bat.batches[id]
	if ok {
		s.bat.stats.Polls++
	}
	s.bat.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no such batch")
		return
	}
	writeJSON(w, http.StatusOK, s.step(b))
}

// step moves a batch one status on and returns how it stands. The lines
// run outside the lock; a batch is stepped by one poll at a time.
func (s *Server) step(b *simBatch) model.BatchObject {
	s.bat.mu.Lock()
	obj := b.obj
	fail := b.fault(BatchFail)
	s.bat.mu.Unlock()
	switch obj.Status {
	case model.BatchValidating:
		if fail != nil {
			obj.Status = model.BatchFailed
			obj.Errors = &struct {
				Data []model.BatchError `json:"data"`
			}{Data: []model.BatchError{{Code: "invalid_request", Message: cmpOr(fail.Match, "the input file failed validation")}}}
		} else {
			obj.Status = model.BatchInProgress
		}
	case model.BatchInProgress:
		out, errs, counts := s.run(b)
		s.bat.mu.Lock()
		if len(out) > 0 {
			obj.OutputFileID = s.bat.keep(out)
		}
		if len(errs) > 0 {
			obj.ErrorFileID = s.bat.keep(errs)
		}
		s.bat.mu.Unlock()
		obj.RequestCounts = counts
		obj.Status = model.BatchFinalizing
	case model.BatchFinalizing:
		obj.Status = model.BatchCompleted
		if b.fault(BatchExpire) != nil {
			obj.Status = model.BatchExpired
		}
	}
	s.bat.mu.Lock()
	b.obj = obj
	b.steps++
	s.bat.mu.Unlock()
	return obj
}

// keep stores a produced file; the caller holds the lock.
func (b *batches) keep(content []byte) string {
	f := &simFile{obj: model.FileObject{ID: b.nextID("file"), Bytes: int64(len(content)), Purpose: "batch_output"}, content: content}
	b.files[f.obj.ID] = f
	return f.obj.ID
}

// fault is the batch's first fault of kind, or nil.
func (b *simBatch) fault(kind string) *BatchFault {
	for i := range b.faults {
		if b.faults[i].Kind == kind {
			return &b.faults[i]
		}
	}
	return nil
}

// matches reports whether a batch fault picks the line.
func (f *BatchFault) matches(l model.BatchRequestLine, emptyMatchesAll bool) bool {
	if f == nil {
		return false
	}
	if f.Match == "" {
		return emptyMatchesAll
	}
	return bytes.Contains(l.Body, []byte(f.Match))
}

// run runs every line through the chat handler and renders the output and
// error files.
func (s *Server) run(b *simBatch) (out, errs []byte, counts model.BatchCounts) {
	expire, missing := b.fault(BatchExpire), b.fault(BatchMissingLine)
	type written struct {
		line  model.BatchOutputLine
		error bool
	}
	var results []written
	counts.Total = len(b.lines)
	for i, l := range b.lines {
		if expire.matches(l, true) {
			results = append(results, written{line: model.BatchOutputLine{ID: fmt.Sprintf("batch_req_%s_%d", b.obj.ID, i),
				CustomID: l.CustomID, Error: &model.BatchError{Code: model.ErrorCodeBatchExpired,
					Message: "This request could not be executed before the completion window expired."}}, error: true})
			counts.Failed++
			continue
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, model.BatchChatEndpoint, bytes.NewReader(l.Body))
		s.handleChat(rec, req)
		s.bat.mu.Lock()
		s.bat.stats.Lines++
		s.bat.mu.Unlock()
		ok := rec.Code >= 200 && rec.Code < 300
		if ok {
			counts.Completed++
		} else {
			counts.Failed++
		}
		if missing.matches(l, false) {
			continue
		}
		body := bytes.TrimSpace(rec.Body.Bytes())
		if !json.Valid(body) {
			// A body that is not JSON (a cut answer) travels as a JSON
			// string, as a provider that kept it would have to.
			body, _ = json.Marshal(string(body))
		}
		results = append(results, written{line: model.BatchOutputLine{ID: fmt.Sprintf("batch_req_%s_%d", b.obj.ID, i),
			CustomID: l.CustomID, Response: &model.BatchResponse{StatusCode: rec.Code,
				RequestID: fmt.Sprintf("req_%s_%d", b.obj.ID, i), Body: body}}, error: !ok})
	}
	if b.fault(BatchOutOfOrder) != nil {
		slices.Reverse(results)
	}
	var ob, eb strings.Builder
	for _, r := range results {
		raw, _ := json.Marshal(r.line)
		dst := &ob
		if r.error {
			dst = &eb
		}
		dst.Write(raw)
		dst.WriteByte('\n')
	}
	return []byte(ob.String()), []byte(eb.String()), counts
}
