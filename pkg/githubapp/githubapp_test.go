package githubapp

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// verifyJWT checks a token as GitHub does: RS256 over header.claims with
// the App's public key, issued by the App, not expired at now.
func verifyJWT(t *testing.T, pub *rsa.PublicKey, jwt string, now time.Time) map[string]any {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("JWT %q: %d parts", jwt, len(parts))
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig); err != nil {
		t.Fatalf("JWT signature: %v", err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	if exp := int64(claims["exp"].(float64)); exp <= now.Unix() || int64(claims["iat"].(float64)) > now.Unix() {
		t.Fatalf("JWT claims %v not valid at %d", claims, now.Unix())
	}
	return claims
}

// A token is bought with a JWT the App's public key verifies, kept until a
// minute before it expires, then bought again; a refusal says its status.
func TestTokenBoughtWithJWTAndKept(t *testing.T) {
	t.Parallel()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var bought atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/app/installations/9/access_tokens" {
			w.Header().Set("Retry-After", "30")
			http.Error(w, `{"message":"rate limited"}`, http.StatusForbidden)
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/app/installations/42/access_tokens" || r.Header.Get("User-Agent") != "assay-test" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		claims := verifyJWT(t, &key.PublicKey, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), now)
		if claims["iss"] != "7" {
			t.Errorf("iss %v, want the App's id 7", claims["iss"])
		}
		n := bought.Add(1)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"token": "ghs_" + string(rune('a'+n)), "expires_at": now.Add(time.Hour)})
	}))
	t.Cleanup(srv.Close)
	a := &App{API: srv.URL, ID: 7, Key: key, Now: func() time.Time { return now }, UserAgent: "assay-test"}
	first, err := a.Token(t.Context(), 42)
	if err != nil || first == "" {
		t.Fatalf("token: %q, %v", first, err)
	}
	now = now.Add(58 * time.Minute)
	if again, err := a.Token(t.Context(), 42); err != nil || again != first || bought.Load() != 1 {
		t.Fatalf("58 minutes on: %q (%v), %d bought; want the first token kept", again, err, bought.Load())
	}
	now = now.Add(90 * time.Second)
	if fresh, err := a.Token(t.Context(), 42); err != nil || fresh == first || bought.Load() != 2 {
		t.Fatalf("within a minute of expiry: %q (%v), %d bought; want a new token", fresh, err, bought.Load())
	}
	var ae *Error
	if _, err := a.Token(t.Context(), 9); !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Header.Get("Retry-After") != "30" {
		t.Fatalf("refused token: %v; want an *Error with status 403 and its Retry-After", err)
	}
	if _, err := a.Token(t.Context(), 0); !errors.Is(err, ErrNoInstallation) {
		t.Fatalf("installation 0: %v", err)
	}
}

// Both settings or neither; each error names its variable.
func TestFromEnv(t *testing.T) {
	t.Parallel()
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	dir := t.TempDir()
	good := filepath.Join(dir, "app.pem")
	if err := os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.pem")
	_ = os.WriteFile(bad, []byte("not a key"), 0o600)
	for _, c := range []struct {
		id, file, want string
	}{
		{"", "", ""},
		{"12", good, ""},
		{"12", "", "ASSAY_GITHUB_APP_KEY_FILE"},
		{"", good, "ASSAY_GITHUB_APP_ID"},
		{"-3", good, "ASSAY_GITHUB_APP_ID"},
		{"12", bad, "ASSAY_GITHUB_APP_KEY_FILE"},
		{"12", filepath.Join(dir, "missing.pem"), "ASSAY_GITHUB_APP_KEY_FILE"},
	} {
		env := map[string]string{"ASSAY_GITHUB_APP_ID": c.id, "ASSAY_GITHUB_APP_KEY_FILE": c.file}
		id, k, err := FromEnv(func(n string) string { return env[n] })
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c, err)
		case c.want == "" && c.id != "" && (id != 12 || k == nil || !k.Equal(key)):
			t.Errorf("%+v: id %d, key %v", c, id, k != nil)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want+":")):
			t.Errorf("%+v: error %v, want one naming %s", c, err, c.want)
		}
	}
}
