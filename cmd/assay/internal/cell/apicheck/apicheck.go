// Package apicheck holds the cell's HTTP traffic in tests to its OpenAPI
// description (schemas/openapi.yaml): every answer's status, headers and
// body must be one the description gives for its operation, a request the
// description refuses must not be accepted, and what was answered is
// counted per operation, status and error code, so a test can ask which
// of the described answers no test has seen.
package apicheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
)

// Answer is one answer an operation gives: "POST /v1/work 400 invalid_json"
// (no code for an answer that is not an error).
type Answer struct {
	Op     string // "POST /v1/work/{id}"
	Status int
	Code   string
}

func (a Answer) String() string {
	return strings.TrimSpace(fmt.Sprintf("%s %d %s", a.Op, a.Status, a.Code))
}

// Checker validates traffic against one description. One Checker may
// serve many cells and tests at once.
type Checker struct {
	v     validator.Validator
	model *v3.Document

	mu   sync.Mutex
	seen map[Answer]int
}

// New reads the description and checks it is a valid OpenAPI document.
func New(spec []byte) (*Checker, error) {
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		return nil, fmt.Errorf("apicheck: %w", err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("apicheck: build the model: %w", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		return nil, fmt.Errorf("apicheck: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		return nil, fmt.Errorf("apicheck: the description is not valid OpenAPI: %v", verrs)
	}
	return &Checker{v: v, model: &model.Model, seen: map[Answer]int{}}, nil
}

// Wrap serves next and checks each request and answer, telling report what
// does not hold. A path the description does not have is served
// unchecked (the routes test holds the description and the routes
// together).
func (c *Checker) Wrap(next http.Handler, report func(string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		item, errs, tmpl := paths.FindPath(r, c.model, nil)
		if item == nil || len(errs) > 0 || item.GetOperations().GetOrZero(strings.ToLower(r.Method)) == nil {
			next.ServeHTTP(w, r)
			return
		}
		// The body is kept as the handler reads it, so a slow or endless
		// body reaches the handler as it would without the check.
		var read bytes.Buffer
		if r.Body != nil {
			r.Body = teeBody{io.TeeReader(r.Body, &read), r.Body}
		}
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		body := read.Bytes()
		op := r.Method + " " + tmpl
		check := r.Clone(r.Context())
		check.Body = io.NopCloser(bytes.NewReader(body))
		// A request the handler took (2xx) was read whole: the description
		// must allow it.
		if rec.status/100 == 2 {
			if ok, verrs := c.v.ValidateHttpRequest(check); !ok {
				report(fmt.Sprintf("%s answered %d to a request its description refuses: %s", op, rec.status, describe(verrs)))
			}
		}
		code := ""
		if isJSON(rec.Header().Get("Content-Type")) && rec.status >= 400 {
			var e struct{ Error struct{ Code string } }
			_ = json.Unmarshal(rec.body.Bytes(), &e)
			code = e.Error.Code
		}
		resp := &http.Response{StatusCode: rec.status, Header: rec.Header().Clone(), Request: check}
		if rec.streamed {
			// A stream's body is not kept; its status and type are checked
			// with an empty body of that type.
			resp.Body = io.NopCloser(strings.NewReader(""))
		} else {
			resp.Body = io.NopCloser(bytes.NewReader(rec.body.Bytes()))
		}
		check.Body = io.NopCloser(bytes.NewReader(body))
		if ok, verrs := c.v.ValidateHttpResponse(check, resp); !ok {
			report(fmt.Sprintf("%s answered %d %s as its description does not say: %s", op, rec.status, code, describe(verrs)))
		}
		c.mu.Lock()
		c.seen[Answer{Op: op, Status: rec.status, Code: code}]++
		c.mu.Unlock()
	})
}

func describe(verrs []*verrors.ValidationError) string {
	var parts []string
	for _, e := range verrs {
		s := e.Message
		if e.Reason != "" {
			s += ": " + e.Reason
		}
		for _, f := range e.SchemaValidationErrors {
			s += fmt.Sprintf(" [%s at %s]", f.Reason, f.FieldPath)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func isJSON(ct string) bool {
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "application/json"
}

// Described is every answer the description gives: each operation's
// statuses, and for an error status each code its schema's enum lists.
func (c *Checker) Described() []Answer {
	var out []Answer
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			if op.Responses == nil {
				continue
			}
			name := strings.ToUpper(method) + " " + path
			for st, resp := range op.Responses.Codes.FromOldest() {
				status, _ := strconv.Atoi(st)
				codes := map[string]bool{}
				if resp.Content != nil && status >= 400 {
					if mt := resp.Content.GetOrZero("application/json"); mt != nil && mt.Schema != nil {
						collectCodes(mt.Schema.Schema(), codes, 0)
					}
				}
				if len(codes) == 0 {
					out = append(out, Answer{Op: name, Status: status})
				}
				for code := range codes {
					out = append(out, Answer{Op: name, Status: status, Code: code})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// collectCodes finds the enum (or const) of error.code in an error
// schema, through allOf, oneOf and anyOf.
func collectCodes(s *base.Schema, codes map[string]bool, depth int) {
	if s == nil || depth > 8 {
		return
	}
	for _, list := range [][]*base.SchemaProxy{s.AllOf, s.OneOf, s.AnyOf} {
		for _, sub := range list {
			collectCodes(sub.Schema(), codes, depth+1)
		}
	}
	if s.Properties == nil {
		return
	}
	if e := s.Properties.GetOrZero("error"); e != nil {
		collectCodes(e.Schema(), codes, depth+1)
	}
	if p := s.Properties.GetOrZero("code"); p != nil {
		if cs := p.Schema(); cs != nil {
			for _, v := range cs.Enum {
				codes[v.Value] = true
			}
			if cs.Const != nil {
				codes[cs.Const.Value] = true
			}
		}
	}
}

// Seen is every answer checked so far, with how many times.
func (c *Checker) Seen() map[Answer]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Answer]int, len(c.seen))
	for k, v := range c.seen {
		out[k] = v
	}
	return out
}

// Operations is every "METHOD /path" the description has.
func (c *Checker) Operations() []string {
	var out []string
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().FromOldest() {
			out = append(out, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

type teeBody struct {
	io.Reader
	io.Closer
}

// recorder passes an answer through and keeps its status and, unless it
// is an event stream, its body.
type recorder struct {
	http.ResponseWriter
	status   int
	wrote    bool
	streamed bool
	body     bytes.Buffer
}

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
		mt, _, _ := mime.ParseMediaType(r.Header().Get("Content-Type"))
		r.streamed = mt == "text/event-stream"
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if !r.streamed && r.body.Len() < 16<<20 {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes and
// write deadlines of event streams).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
