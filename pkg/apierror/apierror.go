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
