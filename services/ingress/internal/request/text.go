package request

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"assay.dev/pkg/apierror"
)

// What a caller names reaches Postgres as text, and a text column holds
// UTF-8 without NUL: anything else makes the query fail, and a failed
// query is answered 503 "try again", which asking again never passes. So
// the API checks every path, query value and body string where it comes
// in, and refuses what is not text with an answer that says so: a path
// that cannot name anything is 404 not_found (TextPaths), a query value
// 400 invalid_query naming the parameter (TextQuery), a body string 400
// invalid_input naming the field (decodeFrom, with EscapeError for
// what its JSON escapes make).

// storable reports whether s is text a Postgres text column holds as it
// is: valid UTF-8 (so no surrogate half and no overlong form) without NUL.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// TextPaths answers a request to the API (/v1/…) whose path, once its
// percent-escapes are undone, is not storable text with 404 not_found:
// no work, batch or review item has such an id. The console's pages read
// nothing themselves and pass; their scripts' calls are checked here.
func TextPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && !storable(r.URL.Path) {
			apierror.Write(w, http.StatusNotFound, "not_found",
				"no such resource: the path is not UTF-8 text without NUL, so it names nothing")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// TextQuery refuses a request to an operation that takes a query when a
// parameter's name or value is not storable text: 400 invalid_query,
// naming the parameter. It is wrapped around every such operation, so a
// filter or a cursor is text before a handler reads it.
func TextQuery(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name, values := range r.URL.Query() {
			if !storable(name) {
				apierror.Write(w, http.StatusBadRequest, "invalid_query",
					"a query parameter's name is not UTF-8 text without NUL")
				return
			}
			for _, v := range values {
				if !storable(v) {
					apierror.Write(w, http.StatusBadRequest, "invalid_query",
						fmt.Sprintf("%s: not UTF-8 text without NUL", shown(name)))
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// EscapeError is a string in a request body whose JSON escapes make what
// is not storable text: \u0000, or half of a UTF-16 surrogate pair alone
// (\ud800), which encoding/json would quietly turn into U+FFFD. The raw
// bytes of a body are checked as they are read (contract.TextError);
// this is what they spell.
type EscapeError struct {
	// Path is where the string is: "note", "items[2].sourceId"; Key says
	// it is a key of the object there.
	Path string
	Key  bool
	// NUL is set for \u0000; otherwise it is a surrogate half.
	NUL bool
}

func (e *EscapeError) Error() string {
	where := e.Path
	if e.Key {
		where = "a key"
		if e.Path != "" {
			where += " in " + e.Path
		}
	}
	if where == "" {
		where = "a string"
	}
	what := `escapes half of a UTF-16 surrogate pair alone (\ud800 to \udfff without its other half)`
	if e.NUL {
		what = `escapes U+0000 (\u0000)`
	}
	return where + " " + what + ", which is not text the cell stores"
}

// escapeFault is the *EscapeError for s, a string just decoded from
// body, whose raw literal ends at end (the decoder's offset after it), or
// nil when s is text as it was sent. A NUL can only have come from
// \u0000 (a raw one was refused as it was read); a U+FFFD may be one the
// body spelled, so only then is the literal read again.
func escapeFault(s string, body []byte, end int64, path string, key bool) error {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return &EscapeError{Path: path, Key: key, NUL: true}
	case !strings.Contains(s, "\uFFFD"):
		return nil
	case end <= 0 || end > int64(len(body)) || loneSurrogate(rawString(body[:end])):
		return &EscapeError{Path: path, Key: key}
	}
	return nil
}

// rawString is the inside of the JSON string literal that b ends with
// (its closing quote last), escapes as written.
func rawString(b []byte) []byte {
	if len(b) == 0 || b[len(b)-1] != '"' {
		return nil
	}
	for i := len(b) - 2; i >= 0; i-- {
		if b[i] != '"' {
			continue
		}
		// A quote preceded by an odd run of backslashes is escaped.
		n := 0
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return b[i+1 : len(b)-1]
		}
	}
	return nil
}

// loneSurrogate reports whether the inside of a JSON string literal
// escapes a surrogate half without its other half: a high one (\ud800 to
// \udbff) not followed by a low one (\udc00 to \udfff), or a low one
// alone.
func loneSurrogate(lit []byte) bool {
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' || i+1 >= len(lit) {
			continue
		}
		if lit[i+1] != 'u' {
			i++ // \n, \", \\ …: the escaped byte is no escape's start
			continue
		}
		r, ok := hex4(lit[i+2:])
		switch {
		case !ok:
			return true
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		case r >= 0xd800 && r <= 0xdbff:
			next, ok := hex4(lit[min(i+8, len(lit)):])
			if i+7 >= len(lit) || lit[i+6] != '\\' || lit[i+7] != 'u' || !ok || next < 0xdc00 || next > 0xdfff {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
