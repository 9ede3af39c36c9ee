package page

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// Every page is served whole: the shared script put in where its marker
// stood, the console's style in the pages that share it, and a policy
// that allows exactly its own inline script and style.
func TestPagesAreWholeAndAllowOnlyThemselves(t *testing.T) {
	t.Parallel()
	style := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindSubmatch(consoleSource)[1]
	for name, p := range map[string]Page{"console": Console, "work": Work, "review": Review} {
		if bytes.Contains(p.html, []byte("is put here when the page is served")) {
			t.Errorf("%s: a marker is left in the page", name)
		}
		if !bytes.Contains(p.html, bytes.TrimSpace(consoleSharedJS)) {
			t.Errorf("%s: the shared script is not in the page", name)
		}
		if name != "console" && !bytes.Contains(p.html, style) {
			t.Errorf("%s: the console's style is not in the page", name)
		}
		for _, tag := range []string{"script", "style"} {
			m := regexp.MustCompile(`(?s)<` + tag + `>(.*?)</` + tag + `>`).FindSubmatch(p.html)
			sum := sha256.Sum256(m[1])
			if want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(p.csp, want) {
				t.Errorf("%s: the policy %q does not allow its own %s %s", name, p.csp, tag, want)
			}
		}
		if strings.Contains(p.csp, "unsafe-inline") || !strings.HasPrefix(p.csp, "default-src 'self'") {
			t.Errorf("%s: policy %q", name, p.csp)
		}
	}
}

// Serve answers the page with its policy and no caching; HEAD gets the
// headers alone.
func TestServe(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Review.Serve(rec, httptest.NewRequest(http.MethodGet, "/console/reviews", nil))
	h := rec.Header()
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), Review.html) || h.Get("Content-Security-Policy") != Review.csp ||
		h.Get("Cache-Control") != "no-store" || h.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Errorf("GET: %d, headers %v, %d bytes", rec.Code, h, rec.Body.Len())
	}
	rec = httptest.NewRecorder()
	Console.Serve(rec, httptest.NewRequest(http.MethodHead, "/console", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") == "0" {
		t.Errorf("HEAD: %d, %d bytes, Content-Length %q", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Length"))
	}
}
