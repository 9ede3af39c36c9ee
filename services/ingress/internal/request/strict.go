package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"assay.dev/pkg/api"
	"assay.dev/pkg/contract"
)

// decodeLimits bound what one request body may hold, so a body is refused
// at its first excess rather than after all of it was decoded.
type decodeLimits struct {
	Depth      int // nesting of objects and arrays
	Keys       int // keys of one object
	Items      int // elements of one array
	StringSize int // bytes of one string (input text included)
}

// requestLimits are the API's: deep and wide enough for any contract's
// input, far below what would make a body expensive to refuse.
var requestLimits = decodeLimits{Depth: 32, Keys: 256, Items: api.MaxBatchItems, StringSize: api.MaxDiffCeiling}

// Decode decodes one JSON object into v as its struct tags name it,
// and refuses what encoding/json would let through quietly: a field name
// in another case (it matches names case-insensitively), a key given twice
// anywhere, input objects included (it keeps the last, while a model or a
// schema may read the first), a value of the wrong kind, anything after
// the object. Errors name the place in the body and say what is wrong in
// the API's words, never Go's type names. The body is walked once, token
// by token, and the walk stops at the first fault.
func Decode(body []byte, v any) error {
	return decodeFrom(bytes.NewReader(body), v)
}

// decodeFrom is decodeStrict reading the body as it walks it: a
// body refused at its first fault is read no further than that, and a
// byte that is not storable text (invalid UTF-8, NUL: encoding/json would
// turn the first into U+FFFD quietly) stops it too, as a
// *contract.TextError; so does a string whose JSON escapes make what is
// not (\u0000, a surrogate half alone), as an *EscapeError naming where
// it is. Errors of r itself (its size cap, its deadline) come back as
// they are.
func decodeFrom(r io.Reader, v any) error {
	var seen bytes.Buffer
	src := &textReader{r: io.TeeReader(r, &seen)}
	dec := json.NewDecoder(src)
	dec.UseNumber()
	w := walker{dec: dec, lim: requestLimits, seen: &seen}
	if err := w.value(reflect.TypeOf(v).Elem(), "", 0); err != nil {
		if src.err != nil {
			return readFault(src.err)
		}
		return fmt.Errorf("request body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		if src.err != nil {
			return readFault(src.err)
		}
		return errors.New("request body: unexpected data after the JSON object")
	}
	// The walk checked every name, kind and key; what remains cannot fail
	// for the request's own fault.
	if err := json.Unmarshal(seen.Bytes(), v); err != nil {
		return errors.New("request body: could not be decoded")
	}
	return nil
}

// ReadError is a body that could not be read (its size cap, its
// deadline, the connection), as opposed to one that was read and refused.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return "request body: " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// readFault is the reader's error as decodeFrom returns it: text
// that is not storable as it is, anything else as a *ReadError.
func readFault(err error) error {
	var te *contract.TextError
	if errors.As(err, &te) {
		return te
	}
	return &ReadError{Err: err}
}

// textReader passes on what r reads while it is storable text: UTF-8
// without NUL. At the first byte that is not, or at r's own error, it
// keeps the error and reads no more.
type textReader struct {
	r     io.Reader
	off   int    // bytes passed on so far
	carry []byte // the start of a character the next read completes
	err   error  // the reader's own error or a *contract.TextError; not io.EOF
}

func (t *textReader) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n, err := t.r.Read(p)
	// b is the carried start of a character and what came now; b[i] is
	// byte base+i of the body.
	base := t.off - len(t.carry)
	b := append(t.carry, p[:n]...)
	t.carry = nil
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == 0:
			t.err = &contract.TextError{Offset: base + i, NUL: true}
		case c < utf8.RuneSelf:
			i++
			continue
		case !utf8.FullRune(b[i:]) && err == nil:
			t.carry = append([]byte(nil), b[i:]...)
			i = len(b)
			continue
		default:
			if r, size := utf8.DecodeRune(b[i:]); r != utf8.RuneError || size > 1 {
				i += size
				continue
			}
			t.err = &contract.TextError{Offset: base + i}
		}
		return 0, t.err
	}
	t.off += n
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// walker checks one JSON value against the Go type it will decode into.
type walker struct {
	dec  *json.Decoder
	lim  decodeLimits
	seen *bytes.Buffer // the body as read so far, for a string's escapes
}

var rawMessage = reflect.TypeOf(json.RawMessage(nil))

func (w walker) value(t reflect.Type, path string, depth int) error {
	tok, err := w.dec.Token()
	if err != nil {
		return syntaxAt(path, err)
	}
	// null is the zero value of what has one apart from its contents (an
	// absent list, a missing pointer); a string, a number or a flag must
	// be given as one.
	if tok == nil {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
			return nil
		}
		return fmt.Errorf("%smust not be null", At(path))
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == rawMessage || t.Kind() == reflect.Interface:
		return w.any(tok, path, depth)
	case t.Kind() == reflect.Struct:
		if tok != json.Delim('{') {
			return kindError(path, "an object", tok)
		}
		return w.object(t, path, depth+1)
	case t.Kind() == reflect.Slice:
		if tok != json.Delim('[') {
			return kindError(path, "an array", tok)
		}
		return w.array(t.Elem(), path, depth+1)
	case t.Kind() == reflect.String:
		s, ok := tok.(string)
		if !ok {
			return kindError(path, "a string", tok)
		}
		return w.text(s, path, false)
	case t.Kind() == reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return kindError(path, "true or false", tok)
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return kindError(path, "a whole number", tok)
		}
		if _, err := strconv.ParseInt(string(n), 10, t.Bits()); err != nil {
			return fmt.Errorf("%smust be a whole number within range, not %s", At(path), n)
		}
	default:
		return fmt.Errorf("%scannot be read", At(path))
	}
	return nil
}

// object checks the members of an object that decodes into struct t:
// each name exactly a field's, each once.
func (w walker) object(t reflect.Type, path string, depth int) error {
	if depth > w.lim.Depth {
		return fmt.Errorf("%snested deeper than %d", At(path), w.lim.Depth)
	}
	fields := jsonFields(t)
	seen := map[string]bool{}
	for w.dec.More() {
		key, err := w.key(path, len(seen))
		if err != nil {
			return err
		}
		f, ok := fields[key]
		if !ok {
			return unknownField(path, key, fields)
		}
		if seen[key] {
			return fmt.Errorf("%s%s is given twice", At(path), shown(key))
		}
		seen[key] = true
		if err := w.value(f, join(path, key), depth); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return syntaxAt(path, err)
}

func (w walker) array(elem reflect.Type, path string, depth int) error {
	if depth > w.lim.Depth {
		return fmt.Errorf("%snested deeper than %d", At(path), w.lim.Depth)
	}
	for i := 0; w.dec.More(); i++ {
		if i >= w.lim.Items {
			return &TooManyError{Path: path, Limit: w.lim.Items}
		}
		if err := w.value(elem, path+"["+strconv.Itoa(i)+"]", depth); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // ']'
	return syntaxAt(path, err)
}

// any checks a value of free form (a contract's input): its keys unique,
// within the limits; the contract's schema decides the rest.
func (w walker) any(tok json.Token, path string, depth int) error {
	switch tok {
	case json.Delim('{'):
		depth++
		if depth > w.lim.Depth {
			return fmt.Errorf("%snested deeper than %d", At(path), w.lim.Depth)
		}
		seen := map[string]bool{}
		for w.dec.More() {
			key, err := w.key(path, len(seen))
			if err != nil {
				return err
			}
			if seen[key] {
				return fmt.Errorf("%s%s is given twice", At(path), shown(key))
			}
			seen[key] = true
			next, err := w.dec.Token()
			if err != nil {
				return syntaxAt(path, err)
			}
			if err := w.any(next, join(path, key), depth); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return syntaxAt(path, err)
	case json.Delim('['):
		depth++
		if depth > w.lim.Depth {
			return fmt.Errorf("%snested deeper than %d", At(path), w.lim.Depth)
		}
		for i := 0; w.dec.More(); i++ {
			if i >= w.lim.Items {
				return &TooManyError{Path: path, Limit: w.lim.Items}
			}
			next, err := w.dec.Token()
			if err != nil {
				return syntaxAt(path, err)
			}
			if err := w.any(next, path+"["+strconv.Itoa(i)+"]", depth); err != nil {
				return err
			}
		}
		_, err := w.dec.Token()
		return syntaxAt(path, err)
	}
	if s, ok := tok.(string); ok {
		return w.text(s, path, false)
	}
	return nil
}

// TooManyError is an array with more elements than the limit: where it
// is, so a caller can name its own limit (a batch's items).
type TooManyError struct {
	Path  string
	Limit int
}

func (e *TooManyError) Error() string {
	return fmt.Sprintf("%smore than %d elements", At(e.Path), e.Limit)
}

// key reads an object's next key, the (n+1)th.
func (w walker) key(path string, n int) (string, error) {
	if n >= w.lim.Keys {
		return "", fmt.Errorf("%smore than %d keys", At(path), w.lim.Keys)
	}
	tok, err := w.dec.Token()
	if err != nil {
		return "", syntaxAt(path, err)
	}
	key, _ := tok.(string)
	return key, w.text(key, path, true)
}

// text checks the string (a key of the object at path, or its value)
// the decoder just read: within the size limit, and text as it was sent.
func (w walker) text(s, path string, key bool) error {
	if len(s) > w.lim.StringSize {
		return fmt.Errorf("%sa string longer than %d bytes", At(path), w.lim.StringSize)
	}
	var body []byte
	if w.seen != nil {
		body = w.seen.Bytes()
	}
	return escapeFault(s, body, w.dec.InputOffset(), path, key)
}

// jsonFields maps the names a struct's fields take in JSON to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func unknownField(path, key string, fields map[string]reflect.Type) error {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Errorf("%sunknown field %s (names are case-sensitive: %q)", At(path), shown(key), name)
		}
	}
	return fmt.Errorf("%sunknown field %s", At(path), shown(key))
}

func kindError(path, want string, got json.Token) error {
	return fmt.Errorf("%smust be %s, not %s", At(path), want, kindOf(got))
}

// kindOf names a token's JSON kind.
func kindOf(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "true or false"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "an array"
	}
	return "a value"
}

// syntaxAt names where the JSON stopped being JSON: a byte offset, never
// the decoder's Go words.
func syntaxAt(path string, err error) error {
	var se *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("ends before the JSON is complete")
	case errors.As(err, &se):
		return fmt.Errorf("not JSON at byte %d (%s)", se.Offset, In(path))
	}
	return fmt.Errorf("not JSON (%s)", In(path))
}

func join(path, key string) string {
	if len(key) > 64 {
		key = key[:64] + "…"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// At prefixes a message with the place it is about ("" for the body's
// object itself).
func At(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

// In names the place a message is about as a phrase ("in items[0]").
func In(path string) string {
	if path == "" {
		return "in the object"
	}
	return "in " + path
}

// shown is a caller's key as a message quotes it: at most 64 bytes.
func shown(key string) string {
	if len(key) > 64 {
		key = key[:64] + "…"
	}
	return strconv.Quote(key)
}
