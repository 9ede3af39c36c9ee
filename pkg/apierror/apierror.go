// Package apierror writes the JSON error every assay HTTP endpoint answers
// with: a stable code a program can act on and a message a person can read.
package apierror

import (
	"encoding/json"
	"net/http"
)

// Body is the error document.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the code and message of an error.
type Detail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Write sends status with the error document.
func Write(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Body{Error: Detail{Code: code, Message: message}})
}

// JSON sends status with v encoded as JSON.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Error is a refusal on its way to the caller: an HTTP status, a stable
// code and a message for a person.
type Error struct {
	Status  int
	Code    string
	Message string
}

// New is an Error.
func New(status int, code, message string) *Error {
	return &Error{Status: status, Code: code, Message: message}
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Write answers with the error document.
func (e *Error) Write(w http.ResponseWriter) { Write(w, e.Status, e.Code, e.Message) }

// JSONErrors makes the plain-text 404 and 405 that http.ServeMux writes for
// an unknown path or method into the error document (not_found,
// method_not_allowed, with the Allow header kept). Answers the handlers
// write themselves pass untouched.
func JSONErrors(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&muxErrors{ResponseWriter: w, path: r.URL.Path}, r)
	})
}

type muxErrors struct {
	http.ResponseWriter
	path     string
	replaced bool
}

func (m *muxErrors) WriteHeader(status int) {
	plain := m.Header().Get("Content-Type") != "application/json"
	switch {
	case status == http.StatusNotFound && plain:
		m.replaced = true
		Write(m.ResponseWriter, status, "not_found", "no such path: "+m.path)
	case status == http.StatusMethodNotAllowed && plain:
		m.replaced = true
		Write(m.ResponseWriter, status, "method_not_allowed", "this path answers "+m.Header().Get("Allow"))
	default:
		m.ResponseWriter.WriteHeader(status)
	}
}

func (m *muxErrors) Write(b []byte) (int, error) {
	if m.replaced {
		return len(b), nil // the mux's plain text, already answered as JSON
	}
	return m.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (m *muxErrors) Unwrap() http.ResponseWriter { return m.ResponseWriter }
