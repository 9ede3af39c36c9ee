package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// APIClient calls a cell's HTTP API as a tenant.
type APIClient struct {
	Base, Token string
	HTTP        *http.Client
}

// APIError is a refusal the API answered: its status, code and message.
type APIError struct {
	Status        int
	Code, Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Call sends one request and decodes a 2xx answer's body into out (when
// not nil); any other answer is an *APIError.
func (c *APIClient) Call(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, DecodeAPIError(resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: the answer is not what the API describes: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// DecodeAPIError is the *APIError of a refusal's body.
func DecodeAPIError(status int, raw []byte) error {
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
		return &APIError{Status: status, Code: "unknown", Message: strings.TrimSpace(string(raw))}
	}
	return &APIError{Status: status, Code: e.Error.Code, Message: e.Error.Message}
}
