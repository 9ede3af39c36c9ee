package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/contract"
)

// DecodeBody reads r's body into v as decodeFrom does, within
// limit: a body refused at its first fault costs what was read up to it.
// The refusal comes with the fault it is for.
func DecodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) (*apierror.Error, error) {
	if r.ContentLength > limit {
		return apierror.New(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("request body is over %d bytes", limit)), nil
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	err := decodeFrom(body, v)
	refused := Refusal(err, limit)
	var re *ReadError
	if refused != nil && !errors.As(err, &re) {
		// Refused before its end: the rest is read and dropped (no
		// decoding, within the limit and the read deadline), so the
		// client, still sending, gets the answer rather than a reset
		// connection.
		buf := drainBuffers.Get().(*[]byte)
		_, _ = io.CopyBuffer(io.Discard, body, *buf)
		drainBuffers.Put(buf)
	}
	return refused, err
}

// drainBuffers read what a refused body has left in large pieces: a few
// reads for megabytes, not hundreds.
var drainBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// Refusal is the answer to a body decodeFrom refused.
func Refusal(err error, limit int64) *apierror.Error {
	var re *ReadError
	var te *contract.TextError
	var ee *EscapeError
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te):
		return apierror.New(http.StatusBadRequest, "invalid_input", "request body has "+te.Error()+"; send UTF-8 text without NUL")
	case errors.As(err, &ee):
		return apierror.New(http.StatusBadRequest, "invalid_input", "request body: "+ee.Error()+"; send UTF-8 text without NUL")
	case !errors.As(err, &re):
		return apierror.New(http.StatusBadRequest, "invalid_json", err.Error())
	case errors.As(err, &mbe):
		return apierror.New(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("request body is over %d bytes", limit))
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return apierror.New(http.StatusRequestTimeout, "request_timeout", "the request body did not arrive within the server's read timeout")
	}
	return apierror.New(http.StatusBadRequest, "bad_request", "could not read the request body")
}

// ReadBody reads a request's body within limit bytes (a webhook's, whose
// signature is over its bytes). A body declared larger is refused before a
// byte of it is read; one that does not arrive within the server's read
// timeout is 408.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *apierror.Error) {
	tooLarge := apierror.New(http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("request body is over %d bytes", limit))
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil:
		return body, nil
	case errors.As(err, &mbe):
		return nil, tooLarge
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return nil, apierror.New(http.StatusRequestTimeout, "request_timeout", "the request body did not arrive within the server's read timeout")
	}
	return nil, apierror.New(http.StatusBadRequest, "bad_request", "could not read the request body")
}

// Compact is raw without insignificant space, or raw as it is when it is
// not JSON.
func Compact(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}
