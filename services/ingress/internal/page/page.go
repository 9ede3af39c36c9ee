// Package page is the console's pages as they are served: the console, a
// work item's page and the review screen, each one document with its
// inline script and style, the console's style and shared script put into
// each, and a policy that allows it nothing else.
package page

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

//go:embed console.html
var consoleSource []byte

//go:embed console_shared.js
var consoleSharedJS []byte

// A Page is one of the console's pages as served, with its policy.
type Page struct {
	html []byte
	csp  string
}

func newPage(html []byte) Page { return Page{html: html, csp: pageCSP(html)} }

// Console is the console: one page, no resources from anywhere. It holds
// no figures itself and needs no credential; its script asks for a token
// and reads /v1/console/events with it.
var Console = newPage(withSharedScript(consoleSource))

// Work is a work item's page: like the console, one page with nothing in
// it but its script, which reads /v1/console/work/{id} with the token the
// console keeps in the tab.
var Work = newPage(withConsoleStyle(consoleWorkSource))

// Review is the review screen: the queue, and the item named by ?item=
// with its diff and findings.
var Review = newPage(withConsoleStyle(consoleReviewSource))

// withSharedScript puts the script every console page shares
// (console_shared.js) into page's own, where its marker stands.
func withSharedScript(page []byte) []byte {
	const marker = "  /* the console's shared script (console_shared.js) is put here when the page is served */\n"
	if !bytes.Contains(page, []byte(marker)) {
		panic("ingress: a console page has no place for the shared script")
	}
	return bytes.Replace(page, []byte(marker), consoleSharedJS, 1)
}

// pageCSP allows a page nothing but itself: its one inline script and
// one inline style, by hash, and requests to its own origin.
func pageCSP(page []byte) string {
	csp := "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	for _, k := range []struct{ directive, tag string }{{"script-src", "script"}, {"style-src", "style"}} {
		m := regexp.MustCompile(`(?s)<` + k.tag + `>(.*?)</` + k.tag + `>`).FindSubmatch(page)
		if m == nil {
			panic("ingress: a console page has no inline " + k.tag)
		}
		sum := sha256.Sum256(m[1])
		csp += "; " + k.directive + " 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	return csp
}

// Serve answers with the page and its policy.
func (p Page) Serve(w http.ResponseWriter, r *http.Request) {
	page, csp := p.html, p.csp
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(page)))
	w.WriteHeader(http.StatusOK)
	if !strings.EqualFold(r.Method, http.MethodHead) {
		_, _ = w.Write(page)
	}
}

//go:embed console_work.html
var consoleWorkSource []byte

// withConsoleStyle is a console page with the console's own style rules
// and the shared script in it, so the pages look and sign in alike from
// one stylesheet and one script, and each still loads nothing.
func withConsoleStyle(page []byte) []byte {
	const marker = "/* the console's own rules (console.html) are put here when the page is served */\n"
	m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindSubmatch(consoleSource)
	if m == nil || !bytes.Contains(page, []byte(marker)) {
		panic("ingress: a console page or the console has no style to share")
	}
	return withSharedScript(bytes.Replace(page, []byte(marker), m[1], 1))
}

//go:embed console_review.html
var consoleReviewSource []byte
