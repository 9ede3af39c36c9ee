package cell_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	"github.com/pb33f/libopenapi/datamodel/high/base"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
	"assay.dev/schemas"
	"assay.dev/services/ingress"
)

// hostile is a value a caller may send where the API takes a string: raw
// as a path, query or header value carries it (percent-escaped on the
// way), lit as it stands between the quotes of a JSON string in a body.
// rawText and litText say whether each is text the cell stores; what is
// not must be refused.
type hostile struct {
	name             string
	raw, lit         string
	rawText, litText bool
	bodyOnly         bool
}

var hostiles = []hostile{
	{name: "NUL", raw: "\x00", lit: `\u0000`},
	{name: "NUL byte", lit: "\x00", bodyOnly: true},
	{name: "byte 0xff", raw: "\xff", lit: "\xff"},
	{name: "overlong NUL", raw: "\xc0\x80", lit: "\xc0\x80"},
	{name: "surrogate bytes", raw: "\xed\xa0\x80", lit: "\xed\xa0\x80"},
	{name: "lone high surrogate escape", raw: `\ud800`, lit: `\ud800`, rawText: true},
	{name: "lone low surrogate escape", raw: `x\udfffy`, lit: `x\udfffy`, rawText: true},
	{name: "reversed surrogate pair", raw: `\udc00\ud800`, lit: `\udc00\ud800`, rawText: true},
	{name: "long", raw: strings.Repeat("a", 6000), lit: strings.Repeat("a", 6000), rawText: true, litText: true},
	{name: "dot dot", raw: "../../../etc/passwd", lit: "../../../etc/passwd", rawText: true, litText: true},
	{name: "quotes", raw: `'";--`, lit: `'\";--`, rawText: true, litText: true},
	{name: "percent text", raw: "%00%ff", lit: "%00%ff", rawText: true, litText: true},
	{name: "line break", raw: "a\r\nb", lit: `a\r\nb`, rawText: true, litText: true},
	{name: "empty", raw: "", lit: "", rawText: true, litText: true},
	// Cursors as a listing would give them, crafted: an id that is not
	// text, a time Postgres does not keep. As text they are harmless
	// anywhere else.
	crafted("crafted work cursor", "1767225600000000 w_\x00"),
	crafted("crafted time cursor", "-9223372036854775808 w_0"),
	crafted("crafted review cursor", "2026-01-02T03:04:05Z|\xff"),
}

// crafted is a cursor made of raw as a listing makes one.
func crafted(name, raw string) hostile {
	c := base64.RawURLEncoding.EncodeToString([]byte(raw))
	return hostile{name: name, raw: c, lit: c, rawText: true, litText: true}
}

// hostileCase is one request: an operation with one parameter, header or
// body string replaced by a hostile value.
type hostileCase struct {
	op, where, param string
	value            hostile
	text             bool // the value, as sent there, is text the cell stores
	method, path     string
	header           map[string]string
	body             []byte
}

func (c hostileCase) String() string {
	return fmt.Sprintf("%s, %s %s = %s", c.op, c.where, c.param, c.value.name)
}

// Every parameter the API's description lists — path, query and header —
// and every string of every request body, each given every hostile value
// in turn (bytes that are not text, raw and percent-escaped; JSON escapes
// of a NUL and of surrogate halves alone; a long value, "../", quotes),
// on a real cell on real Postgres: no answer is a 5xx, and a value that is
// not text is refused (a page excepted, which reads nothing), never taken
// or rewritten. Each answer is held to the description as well.
func TestHostileValuesAreNeverServerErrors(t *testing.T) {
	t.Parallel()
	const secret = "hostile-secret"
	logs := &lockedBuffer{}
	b := celltest.Setup(t, cell.Options{NoClassifier: true, Log: telemetry.NewLogger(logs, "test", "us", slog.LevelInfo),
		Ingress: ingress.Config{GitHubSecret: secret}})
	ctx := context.Background()
	if err := b.Cell.Env.Store.AddOperatorTokenAs(ctx, "ops", store.RoleOperator, "ops-token"); err != nil {
		t.Fatal(err)
	}
	// A batch takes its rate token before its body is read: with room
	// enough, every body is read.
	if err := b.Cell.Env.Store.SetRate(ctx, b.Tenant, 1_000_000, 1_000_000); err != nil {
		t.Fatal(err)
	}
	review := celltest.CodeReview(evalset.Items()[0], "hostile")
	status, sub := b.Submit(t, review)
	if status != http.StatusAccepted {
		t.Fatalf("submit: HTTP %d", status)
	}
	batchBody := map[string]any{"contract": review.Contract, "batchKey": "hostile-1", "items": []map[string]any{
		{"itemId": "a", "sourceId": "shop/hostile#2", "revision": "r1", "input": review.Input}}}
	raw, _ := json.Marshal(batchBody)
	req, _ := http.NewRequest(http.MethodPost, b.Cell.URL+"/v1/batches", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+b.Token)
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var batch struct{ BatchID string }
	_ = json.NewDecoder(resp.Body).Decode(&batch)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || batch.BatchID == "" {
		t.Fatalf("batch: HTTP %d", resp.StatusCode)
	}
	// The ids a case does not replace name things that exist, where
	// something exists to name, so a value elsewhere is read as far as
	// the cell reads it.
	ids := map[string]string{"work": sub.WorkID, "batches": batch.BatchID, "reviews": "rv_000000000000000000000000"}
	bodies := map[string]any{
		"POST /v1/work": map[string]any{"contract": review.Contract, "sourceId": "shop/hostile#3", "revision": review.Revision,
			"lane": "interactive", "input": review.Input},
		"POST /v1/batches": batchBody,
		"POST /v1/reviews/{id}/resolve": map[string]string{"by": "reviewer@example.com", "verdict": "approved",
			"note": "looked at it"},
		"POST /v1/console/work/{id}/actions": map[string]string{"action": "redrive", "confirm": sub.WorkID, "note": "again"},
		"POST /v1/console/reviews/{id}/resolve": map[string]any{"verdict": "amended", "note": "amended",
			"findings": []map[string]any{{"file": "a.go", "line": 1, "severity": "major", "title": "a finding", "body": "why"}}},
		"POST /v1/webhooks/github": map[string]any{"action": "opened", "number": 1, "installation": map[string]any{"id": 991199},
			"repository": map[string]any{"full_name": "nobody/here"},
			"pull_request": map[string]any{"number": 1, "title": "a title", "updated_at": "2026-12-05T00:00:00Z",
				"head": map[string]any{"sha": "0123456789abcdef0123456789abcdef01234567"},
				"base": map[string]any{"sha": "89abcdef0123456789abcdef0123456789abcdef"}}},
	}
	cases, described := hostileCases(t, ids, bodies)
	delivery := 0
	start := time.Now()
	answered := map[int]int{}
	for _, c := range cases {
		req, err := http.NewRequestWithContext(ctx, c.method, b.Cell.URL+c.path, bytes.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		token := b.Token
		if strings.HasPrefix(c.op, "GET /v1/console") || strings.HasPrefix(c.op, "POST /v1/console") {
			token = "ops-token"
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if c.op == "POST /v1/webhooks/github" {
			delivery++
			mac := hmac.New(sha256.New, []byte(secret))
			mac.Write(c.body)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-GitHub-Event", "pull_request")
			req.Header.Set("X-GitHub-Delivery", "hostile-"+strconv.Itoa(delivery))
			req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := b.HTTP.Do(req)
		if err != nil {
			if !c.text || strings.Contains(c.where, "header") {
				// A header value no client sends (a NUL, a line break):
				// net/http refuses it on the way out.
				answered[0]++
				continue
			}
			t.Fatalf("%s: %v", c, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		answered[resp.StatusCode]++
		var doc struct{ Error struct{ Code string } }
		_ = json.Unmarshal(body, &doc)
		switch want, wantCode := refusal(c); {
		case resp.StatusCode >= 500:
			t.Errorf("%s: HTTP %d %s", c, resp.StatusCode, body)
		case c.text:
		case want != 0 && (resp.StatusCode != want || doc.Error.Code != wantCode):
			t.Errorf("%s: HTTP %d %q, want %d %s", c, resp.StatusCode, doc.Error.Code, want, wantCode)
		case want == 0 && (resp.StatusCode < 400 || resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusTooManyRequests):
			t.Errorf("%s: HTTP %d %q, want it refused", c, resp.StatusCode, doc.Error.Code)
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("logged %s", line)
		}
	}
	t.Logf("%d operations, %d parameters and body strings, %d values: %d requests in %s; answers %v (0: not sent)",
		described.ops, described.params, len(hostiles), len(cases), time.Since(start).Round(time.Millisecond), answered)
}

// refusal is the answer a case whose value is not text must get: a status
// and code, or 0 where a refusal of the operation's own (401, 403, 404 of
// the webhook) may come first or a page answers whatever its query.
func refusal(c hostileCase) (int, string) {
	webhook := c.op == "POST /v1/webhooks/github"
	switch {
	case c.where == "path" && strings.HasPrefix(c.path, "/v1/"):
		return http.StatusNotFound, "not_found"
	case c.where == "path":
		return http.StatusOK, "" // a page reads nothing; its script's calls are checked
	case c.where == "query" && c.op == "GET /console/reviews":
		return http.StatusOK, ""
	case c.where == "query" && c.op == "GET /v1/usage":
		return 0, "" // compared with the token's tenant and parsed as times, never queried by
	case c.where == "query":
		return http.StatusBadRequest, "invalid_query"
	case c.where == "body" && !webhook:
		return http.StatusBadRequest, "invalid_input"
	}
	return 0, ""
}

// described counts what the description gave the cases.
type described struct{ ops, params int }

var pathParam = regexp.MustCompile(`\{[a-zA-Z]+\}`)

// hostileCases is every case the description makes: each of its
// operations, each parameter of it and each string of its request body
// (bodies holds a request the operation takes, by operation; the strings
// of a free-form object are the request's own), each hostile value.
func hostileCases(t *testing.T, ids map[string]string, bodies map[string]any) ([]hostileCase, described) {
	t.Helper()
	doc, err := libopenapi.NewDocument(schemas.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatal(err)
	}
	var out []hostileCase
	var d described
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		filled := pathParam.ReplaceAllStringFunc(path, func(string) string {
			for _, kind := range []string{"batches", "reviews"} {
				if strings.Contains(path, "/"+kind+"/") {
					return ids[kind]
				}
			}
			return ids["work"]
		})
		for method, op := range item.GetOperations().FromOldest() {
			name := strings.ToUpper(method) + " " + path
			d.ops++
			params := append(slices.Clone(item.Parameters), op.Parameters...)
			for _, p := range params {
				d.params++
				for _, h := range hostiles {
					// An empty value in a URL or a header is the parameter not
					// given, as the cell reads it; a body string may be empty.
					if h.bodyOnly || h.raw == "" {
						continue
					}
					c := hostileCase{op: name, where: p.In, param: p.Name, value: h, text: h.rawText,
						method: strings.ToUpper(method), path: filled}
					switch p.In {
					case "path":
						c.path = strings.Replace(path, "{"+p.Name+"}", url.PathEscape(h.raw), 1)
						c.path = pathParam.ReplaceAllStringFunc(c.path, func(string) string { return ids["work"] })
					case "query":
						c.path = filled + "?" + url.QueryEscape(p.Name) + "=" + url.QueryEscape(h.raw)
					case "header":
						c.where, c.header = "header", map[string]string{p.Name: h.raw}
					default:
						t.Fatalf("%s: a parameter in %s", name, p.In)
					}
					if op.RequestBody != nil {
						c.body, _ = json.Marshal(bodies[name])
					}
					out = append(out, c)
				}
			}
			if op.RequestBody == nil {
				continue
			}
			body, ok := bodies[name]
			if !ok {
				t.Fatalf("%s takes a body and the test has none for it", name)
			}
			var schema *base.Schema
			if mt := op.RequestBody.Content.GetOrZero("application/json"); mt != nil && mt.Schema != nil {
				schema = mt.Schema.Schema()
			}
			wanted := map[string]bool{}
			stringFields(schema, "", wanted, 0)
			leaves := stringLeaves(body)
			for _, l := range leaves {
				delete(wanted, l.described)
			}
			for f := range wanted {
				t.Errorf("%s: the description lists the string %s, which the test's body does not have", name, f)
			}
			for _, l := range leaves {
				d.params++
				for _, h := range hostiles {
					out = append(out, hostileCase{op: name, where: "body", param: l.at, value: h, text: h.litText,
						method: strings.ToUpper(method), path: filled, body: withString(t, body, l.steps, h.lit)})
				}
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].op < out[j].op })
	return out, d
}

// stringFields puts in out the path of every string the schema s
// describes ("items[].sourceId"), through objects, arrays and allOf.
func stringFields(s *base.Schema, at string, out map[string]bool, depth int) {
	if s == nil || depth > 8 {
		return
	}
	for _, sub := range s.AllOf {
		stringFields(sub.Schema(), at, out, depth+1)
	}
	if slices.Contains(s.Type, "string") {
		out[at] = true
	}
	if s.Properties != nil {
		for name, p := range s.Properties.FromOldest() {
			next := name
			if at != "" {
				next = at + "." + name
			}
			stringFields(p.Schema(), next, out, depth+1)
		}
	}
	if s.Items != nil && s.Items.IsA() {
		stringFields(s.Items.A.Schema(), at+"[]", out, depth+1)
	}
}

// leaf is one string of a request body: where it is, as a message names
// it and as the description does, and the steps to it.
type leaf struct {
	at, described string
	steps         []any
}

// stringLeaves is every string of v (as JSON has it), in a fixed order.
func stringLeaves(v any) []leaf {
	raw, _ := json.Marshal(v)
	var doc any
	_ = json.Unmarshal(raw, &doc)
	var out []leaf
	var walk func(v any, at, described string, steps []any)
	walk = func(v any, at, described string, steps []any) {
		switch x := v.(type) {
		case string:
			out = append(out, leaf{at: at, described: described, steps: slices.Clone(steps)})
		case []any:
			for i, e := range x {
				walk(e, fmt.Sprintf("%s[%d]", at, i), described+"[]", append(steps, i))
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				next, nextDescribed := k, k
				if at != "" {
					next, nextDescribed = at+"."+k, described+"."+k
				}
				walk(x[k], next, nextDescribed, append(steps, k))
			}
		}
	}
	walk(doc, "", "", nil)
	return out
}

// withString is v as JSON with the string at steps written as lit, as it
// stands between quotes, escapes and bytes as they are.
func withString(t *testing.T, v any, steps []any, lit string) []byte {
	t.Helper()
	raw, _ := json.Marshal(v)
	var doc any
	_ = json.Unmarshal(raw, &doc)
	const mark = "\x01hostile\x01"
	var set func(v any, steps []any) any
	set = func(v any, steps []any) any {
		if len(steps) == 0 {
			return mark
		}
		switch x := v.(type) {
		case []any:
			i := steps[0].(int)
			x[i] = set(x[i], steps[1:])
		case map[string]any:
			k := steps[0].(string)
			x[k] = set(x[k], steps[1:])
		}
		return v
	}
	out, err := json.Marshal(set(doc, steps))
	if err != nil {
		t.Fatal(err)
	}
	marked := []byte(`"\u0001hostile\u0001"`)
	if bytes.Count(out, marked) != 1 {
		t.Fatalf("the body's string at %v is not marked once", steps)
	}
	return bytes.Replace(out, marked, []byte(`"`+lit+`"`), 1)
}
