// Package githubapp authenticates to the GitHub REST API as a GitHub App: a
// JSON Web Token signed with the App's private key buys an installation's
// token, which is kept until a minute before it expires. The committer's
// publisher writes check runs and comments with it, and ingress reads pull
// request diffs with it, so one App's credentials serve every tenant that
// installed it.
package githubapp

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"assay.dev/pkg/config"
)

// App is one GitHub App's credentials and the installation tokens they
// bought.
type App struct {
	// API is the REST API's base URL, e.g. https://api.github.com.
	API string
	// ID is the App's id, the JWT's issuer.
	ID int64
	// Key is the App's private key.
	Key *rsa.PrivateKey
	// Client defaults to one with a 30s timeout.
	Client *http.Client
	// Now defaults to time.Now.
	Now func() time.Time
	// UserAgent names the caller; GitHub refuses requests without one.
	UserAgent string

	mu     sync.Mutex
	tokens map[int64]token
}

type token struct {
	value   string
	expires time.Time
}

// Error is GitHub's answer to a token request that did not give one: the
// caller decides from its status and headers whether to ask again.
type Error struct {
	Installation int64
	Status       int
	Header       http.Header
	Body         []byte
}

func (e *Error) Error() string {
	return fmt.Sprintf("github: installation %d token: HTTP %d", e.Installation, e.Status)
}

// ErrNoInstallation is returned for a token of installation 0 or less.
var ErrNoInstallation = errors.New("github: no GitHub App installation named")

// ParseKey reads a GitHub App's private key (PEM, PKCS#1 as GitHub hands
// it out, or PKCS#8).
func ParseKey(pemBytes []byte) (*rsa.PrivateKey, error) {
	b, _ := pem.Decode(pemBytes)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS1PrivateKey(b.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("not an RSA private key: %w", err)
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an RSA private key")
	}
	return rk, nil
}

// Vars are the settings FromEnv reads, for a service's help.
var Vars = []config.Var{
	{Name: "ASSAY_GITHUB_APP_ID", Default: "none", Usage: "the GitHub App's id"},
	{Name: "ASSAY_GITHUB_APP_KEY_FILE", Default: "none", Usage: "the GitHub App's private key (PEM); required with ASSAY_GITHUB_APP_ID"},
}

// FromEnv reads the App's credentials: ASSAY_GITHUB_APP_ID (a positive
// integer) and ASSAY_GITHUB_APP_KEY_FILE (a PEM RSA key), both or neither.
// Neither is (0, nil, nil). Errors name the variable.
func FromEnv(getenv func(string) string) (int64, *rsa.PrivateKey, error) {
	id, keyFile := getenv("ASSAY_GITHUB_APP_ID"), getenv("ASSAY_GITHUB_APP_KEY_FILE")
	switch {
	case id == "" && keyFile == "":
		return 0, nil, nil
	case id == "":
		return 0, nil, errors.New("ASSAY_GITHUB_APP_ID: required with ASSAY_GITHUB_APP_KEY_FILE")
	case keyFile == "":
		return 0, nil, errors.New("ASSAY_GITHUB_APP_KEY_FILE: required with ASSAY_GITHUB_APP_ID")
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 {
		return 0, nil, fmt.Errorf("ASSAY_GITHUB_APP_ID: %q is not a positive integer", config.Redacted(id))
	}
	pemBytes, err := os.ReadFile(keyFile)
	if err != nil {
		return 0, nil, fmt.Errorf("ASSAY_GITHUB_APP_KEY_FILE: %w", err)
	}
	key, err := ParseKey(pemBytes)
	if err != nil {
		return 0, nil, fmt.Errorf("ASSAY_GITHUB_APP_KEY_FILE: %s: %w", keyFile, err)
	}
	return n, key, nil
}

func (a *App) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// JWT is the App's JSON Web Token (RS256), valid for nine minutes and
// issued a minute in the past against clock drift, as GitHub advises.
func (a *App) JWT() (string, error) {
	now := a.now()
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, err := json.Marshal(map[string]any{"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(9 * time.Minute).Unix(),
		"iss": strconv.FormatInt(a.ID, 10)})
	if err != nil {
		return "", err
	}
	signing := header + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, a.Key, crypto.SHA256, sum[:])
	if err != nil {
		return "", fmt.Errorf("github: sign app JWT: %w", err)
	}
	return signing + "." + enc.EncodeToString(sig), nil
}

// Token is the installation's token, bought again a minute before it
// expires. A refusal is an *Error; a request that got no answer is
// wrapped as it failed.
func (a *App) Token(ctx context.Context, installation int64) (string, error) {
	if installation <= 0 {
		return "", ErrNoInstallation
	}
	a.mu.Lock()
	t, ok := a.tokens[installation]
	a.mu.Unlock()
	if ok && a.now().Before(t.expires.Add(-time.Minute)) {
		return t.value, nil
	}
	jwt, err := a.JWT()
	if err != nil {
		return "", err
	}
	path := fmt.Sprintf("/app/installations/%d/access_tokens", installation)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(a.API, "/")+path, bytes.NewReader(nil))
	if err != nil {
		return "", fmt.Errorf("github: %w", config.RedactError(err))
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	req.Header.Set("User-Agent", a.UserAgent)
	req.Header.Set("Authorization", "Bearer "+jwt)
	c := a.Client
	if c == nil {
		c = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("github: POST %s: %w", path, config.RedactError(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("github: POST %s: read: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		return "", &Error{Installation: installation, Status: resp.StatusCode, Header: resp.Header, Body: b}
	}
	var out struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Token == "" {
		return "", fmt.Errorf("github: POST %s: no token in the answer", path)
	}
	a.mu.Lock()
	if a.tokens == nil {
		a.tokens = map[int64]token{}
	}
	a.tokens[installation] = token{out.Token, out.ExpiresAt}
	a.mu.Unlock()
	return out.Token, nil
}
