package cell_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/store"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// otherTenant seeds a second tenant homed in the bundle's cell and returns
// its token: a tenant this cell serves, that must see nothing of acme's.
func otherTenant(t *testing.T, b *celltest.Bundle) string {
	t.Helper()
	tok := store.NewToken()
	if err := b.Cell.Env.Store.SeedTenants(context.Background(), []store.TenantSeed{{ID: "initech", HomeRegion: "us", Token: tok}}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// call sends a request to the cell as token and returns the status and
// body.
func call(t *testing.T, b *celltest.Bundle, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, ok := body.([]byte)
		if !ok {
			raw, _ = json.Marshal(body)
		}
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, b.Cell.URL+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := b.HTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func decode[T any](t *testing.T, raw []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, raw)
	}
	return v
}

// sseMsg is one dispatched server-sent event, or (Comment) a block of
// comment lines only, such as a heartbeat.
type sseMsg struct {
	ID, Event, Data string
	Comment         bool
}

// sseClient reads a text/event-stream as the HTML standard parses one:
// lines end in LF, CRLF or CR; a line starting with a colon is a comment;
// "field: value" loses one space after the colon; data lines join with
// LF; a blank line dispatches; the last event id carries over.
type sseClient struct {
	resp   *http.Response
	br     *bufio.Reader
	lastID string
	cancel context.CancelFunc
}

// openSSE connects to path as token, resuming after lastID when set. A
// refusal comes back as its status and body.
func openSSE(t *testing.T, b *celltest.Bundle, path, token, lastID string) (*sseClient, int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.Cell.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return nil, resp.StatusCode, raw
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("GET %s: Content-Type %q", path, ct)
	}
	c := &sseClient{resp: resp, br: bufio.NewReader(resp.Body), lastID: lastID, cancel: cancel}
	t.Cleanup(c.close)
	return c, http.StatusOK, nil
}

func (c *sseClient) close() {
	c.cancel()
	c.resp.Body.Close()
}

func (c *sseClient) line() (string, error) {
	var b strings.Builder
	for {
		r, _, err := c.br.ReadRune()
		if err != nil {
			return b.String(), err
		}
		switch r {
		case '\n':
			return b.String(), nil
		case '\r':
			if next, _, err := c.br.ReadRune(); err == nil && next != '\n' {
				_ = c.br.UnreadRune()
			}
			return b.String(), nil
		}
		b.WriteRune(r)
	}
}

// next reads up to the next dispatched event or comment block.
func (c *sseClient) next() (sseMsg, error) {
	var data strings.Builder
	event, hasData, comment := "", false, false
	for {
		l, err := c.line()
		if err != nil {
			return sseMsg{}, err
		}
		if l == "" {
			if hasData {
				return sseMsg{ID: c.lastID, Event: cmpOr(event, "message"), Data: strings.TrimSuffix(data.String(), "\n")}, nil
			}
			if comment {
				return sseMsg{Comment: true}, nil
			}
			event = ""
			continue
		}
		if strings.HasPrefix(l, ":") {
			comment = true
			continue
		}
		field, value, _ := strings.Cut(l, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			event = value
		case "data":
			data.WriteString(value + "\n")
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				c.lastID = value
			}
		}
	}
}

// event reads up to the next event, skipping comments.
func (c *sseClient) event(t *testing.T) sseMsg {
	t.Helper()
	for {
		m, err := c.next()
		if err != nil {
			t.Fatalf("event stream: %v", err)
		}
		if !m.Comment {
			return m
		}
	}
}

// ends reads the stream's final event, named end, and then the end of
// the stream itself.
func (c *sseClient) ends(t *testing.T) {
	t.Helper()
	if m := c.event(t); m.Event != "end" || !strings.Contains(m.Data, `"reason"`) {
		t.Fatalf("the event after the last fact: %+v, want end", m)
	}
	for {
		m, err := c.next()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return
		}
		if err != nil || !m.Comment {
			t.Fatalf("after the end event: %+v %v, want the stream to end", m, err)
		}
	}
}

// until reads events up to and including the first named last.
func (c *sseClient) until(t *testing.T, last string) []sseMsg {
	t.Helper()
	var out []sseMsg
	for {
		m := c.event(t)
		out = append(out, m)
		if m.Event == last {
			return out
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func eventNames(ms []sseMsg) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Event)
	}
	return out
}

func ids(ms []sseMsg) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// itemFacts are the events of a batch stream as event/item, sorted.
func itemFacts(t *testing.T, ms []sseMsg) []string {
	t.Helper()
	var out []string
	for _, m := range ms {
		var ev ingress.BatchEvent
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
			t.Fatalf("%s: %s", m.Event, m.Data)
		}
		out = append(out, m.Event+"/"+ev.ItemID)
	}
	slices.Sort(out)
	return out
}

func eventsCell(t *testing.T, o cell.Options) *celltest.Bundle {
	o.Ingress.EventsEvery = 50 * time.Millisecond
	o.Ingress.EventsHeartbeat = 300 * time.Millisecond
	return celltest.Setup(t, o)
}

func moderationItems(texts map[string]string) []ingress.BatchItemRequest {
	var items []ingress.BatchItemRequest
	for id, text := range texts {
		in, _ := json.Marshal(map[string]string{"text": text})
		items = append(items, ingress.BatchItemRequest{ItemID: id, Input: in})
	}
	slices.SortFunc(items, func(a, b ingress.BatchItemRequest) int { return strings.Compare(a.ItemID, b.ItemID) })
	return items
}

func waitBatch(t *testing.T, b *celltest.Bundle, id string, done func(ingress.BatchView) bool) ingress.BatchView {
	t.Helper()
	// A thousand items on a loaded two-core machine take more than a
	// minute: the deadline is for a batch that stopped moving.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		status, raw := call(t, b, http.MethodGet, "/v1/batches/"+id, b.Token, nil)
		if status != http.StatusOK {
			t.Fatalf("GET batch: %d %s", status, raw)
		}
		v := decode[ingress.BatchView](t, raw)
		if done(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s not there after 4m: %s", id, raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBatches(t *testing.T) {
	t.Parallel()
	b := eventsCell(t, cell.Options{})
	other := otherTenant(t, b)

	texts := map[string]string{"m-1": "have a nice day", "m-2": "see you at lunch", "m-3": "thanks for the report",
		"m-4": "buy now, limited offer", "m-5": "you are an idiot", "m-6": "the build is green"}
	items := moderationItems(texts)

	// Refusals: 4xx with a stable code, nothing stored.
	dupID := slices.Clone(items)
	dupID[1].ItemID = dupID[0].ItemID
	dupSource := slices.Clone(items)
	dupSource[1].SourceID, dupSource[2].SourceID = "same", "same"
	badInput := slices.Clone(items)
	badInput[2].Input = json.RawMessage(`{"txt":"no"}`)
	for _, c := range []struct {
		name string
		body any
		code string
	}{
		{"duplicate itemId", ingress.BatchRequest{Contract: "moderation", Items: dupID}, "duplicate_item_id"},
		{"duplicate source", ingress.BatchRequest{Contract: "moderation", Items: dupSource}, "duplicate_source"},
		{"bad input", ingress.BatchRequest{Contract: "moderation", Items: badInput}, "invalid_input"},
		{"no items", ingress.BatchRequest{Contract: "moderation"}, "no_items"},
		{"unknown contract", ingress.BatchRequest{Contract: "nope", Items: items}, "unknown_contract"},
		{"unknown field", []byte(`{"contract":"moderation","items":[],"lane":"interactive"}`), "invalid_json"},
		{"not an object", []byte(`[1]`), "invalid_json"},
		{"bad item id", ingress.BatchRequest{Contract: "moderation", Items: []ingress.BatchItemRequest{{ItemID: "a b", Input: items[0].Input}}}, "invalid_item_id"},
		{"bad key", ingress.BatchRequest{Contract: "moderation", BatchKey: "a b", Items: items}, "invalid_batch_key"},
	} {
		status, raw := call(t, b, http.MethodPost, "/v1/batches", b.Token, c.body)
		if status != http.StatusBadRequest || errorCode(t, raw) != c.code {
			t.Errorf("%s: %d %s, want 400 %s", c.name, status, raw, c.code)
		}
	}
	if n := b.Count(t, `SELECT count(*) FROM work`); n != 0 {
		t.Fatalf("refused batches stored %d work rows", n)
	}
	if status, raw := call(t, b, http.MethodGet, "/v1/batches/b_000000000000000000000000", b.Token, nil); status != http.StatusNotFound || errorCode(t, raw) != "not_found" {
		t.Errorf("unknown batch: %d %s", status, raw)
	}

	status, raw := call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", BatchKey: "sweep-1", Items: items})
	if status != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %s", status, raw)
	}
	sub := decode[ingress.BatchResponse](t, raw)
	if sub.Total != len(items) || len(sub.Items) != len(items) || sub.Duplicate {
		t.Fatalf("batch answer %s", raw)
	}
	// Items are batch-lane work.
	status, raw = call(t, b, http.MethodGet, "/v1/work/"+sub.Items[0].WorkID, b.Token, nil)
	if status != http.StatusOK || decode[ingress.WorkView](t, raw).Lane != "batch" {
		t.Fatalf("item work: %d %s", status, raw)
	}

	// Live progress over SSE, to complete; then resumed from the middle.
	live, status, raw := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, "")
	if live == nil {
		t.Fatalf("batch events: %d %s", status, raw)
	}
	all := live.until(t, "complete")
	live.close()
	if all[0].Event != "queued" || len(all) != len(items)+2 {
		t.Fatalf("batch events %v", eventNames(all))
	}
	var ended []string
	for _, m := range all[1 : len(all)-1] {
		var ev ingress.BatchEvent
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil || ev.BatchID != sub.BatchID || ev.Outcome != m.Event || ev.Total != len(items) {
			t.Fatalf("item event %+v: %s", m, m.Data)
		}
		ended = append(ended, ev.ItemID)
	}
	slices.Sort(ended)
	if len(slices.Compact(ended)) != len(items) {
		t.Fatalf("items ended %v", ended)
	}
	resumed, _, _ := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, all[3].ID)
	rest := resumed.until(t, "complete")
	// The same facts, once each, and the same mark at the end; the order
	// of items that ended between two looks is item order, so ids on the
	// way may differ.
	if got, want := itemFacts(t, rest), itemFacts(t, all[4:]); !slices.Equal(got, want) || rest[len(rest)-1].ID != all[len(all)-1].ID {
		t.Fatalf("resumed after %s: %v ending at %s, want %v ending at %s", all[3].ID, got, rest[len(rest)-1].ID, want, all[len(all)-1].ID)
	}
	// Complete, the stream says so in its final event and ends; resumed
	// from there, it has nothing more and answers 204, which stops an
	// EventSource from reconnecting.
	resumed.ends(t)
	if c, status, raw := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, rest[len(rest)-1].ID); c != nil || status != http.StatusNoContent {
		t.Fatalf("resumed after complete: %d %s, want 204", status, raw)
	}

	v := waitBatch(t, b, sub.BatchID, func(v ingress.BatchView) bool { return v.Complete })
	if v.Total != len(items) || v.Accepted+v.Failed != len(items) || v.Pending != 0 || v.Missing != 0 || v.Counts["accepted"] != v.Accepted ||
		len(v.FailedItems) != v.Failed {
		t.Fatalf("batch view %+v", v)
	}

	// Results: one JSON line per item, in item order.
	status, raw = call(t, b, http.MethodGet, "/v1/batches/"+sub.BatchID+"/results", b.Token, nil)
	if status != http.StatusOK {
		t.Fatalf("results: %d %s", status, raw)
	}
	var lines []ingress.BatchItemView
	for _, l := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		lines = append(lines, decode[ingress.BatchItemView](t, l))
	}
	if len(lines) != len(items) {
		t.Fatalf("%d result lines, want %d", len(lines), len(items))
	}
	for i, l := range lines {
		if l.ItemID != items[i].ItemID || l.Outcome == nil || *l.Outcome != "accepted" || len(l.Output) == 0 {
			t.Errorf("line %d: %+v", i, l)
		}
	}

	// The same key and items: the same batch; other items: refused.
	status, raw = call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", BatchKey: "sweep-1", Items: items})
	if again := decode[ingress.BatchResponse](t, raw); status != http.StatusOK || !again.Duplicate || again.BatchID != sub.BatchID {
		t.Fatalf("same batch again: %d %s", status, raw)
	}
	status, raw = call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", BatchKey: "sweep-1", Items: items[:2]})
	if status != http.StatusConflict || errorCode(t, raw) != "batch_key_reused" {
		t.Fatalf("key with other items: %d %s", status, raw)
	}
	// A second batch naming the same items with the same input: the
	// ingress fence gives back the accepted work.
	status, raw = call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", Items: items[:2]})
	second := decode[ingress.BatchResponse](t, raw)
	if status != http.StatusAccepted || second.BatchID == sub.BatchID || !second.Items[0].Existing || second.Items[0].WorkID != sub.Items[0].WorkID {
		t.Fatalf("second batch of the same items: %d %s", status, raw)
	}

	// Another tenant sees nothing of it.
	for _, p := range []struct{ method, path string }{
		{http.MethodGet, "/v1/batches/" + sub.BatchID},
		{http.MethodGet, "/v1/batches/" + sub.BatchID + "/results"},
		{http.MethodPost, "/v1/batches/" + sub.BatchID + "/cancel"},
		{http.MethodDelete, "/v1/batches/" + sub.BatchID},
	} {
		if status, raw := call(t, b, p.method, p.path, other, nil); status != http.StatusNotFound || errorCode(t, raw) != "not_found" {
			t.Errorf("%s %s as another tenant: %d %s", p.method, p.path, status, raw)
		}
	}
	if c, status, raw := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", other, ""); c != nil || status != http.StatusNotFound {
		t.Errorf("batch events as another tenant: %d %s", status, raw)
	}
	if c, status, raw := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, "w1.0.0.-.0"); c != nil || status != http.StatusBadRequest ||
		errorCode(t, raw) != "invalid_last_event_id" {
		t.Errorf("a work event id on a batch stream: %d %s", status, raw)
	}
}

func TestBatchCancel(t *testing.T) {
	t.Parallel()
	// A call is never cut off by its own timeout here: only the cancel
	// stops it.
	b := eventsCell(t, cell.Options{Classifier: classifier.Config{CallTimeout: time.Hour}})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "hangs until canceled"}); err != nil {
		t.Fatal(err)
	}
	items := moderationItems(map[string]string{"c-1": "this one hangs until canceled", "c-2": "a quick one",
		"c-3": "this one also hangs until canceled"})
	status, raw := call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", Items: items})
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", status, raw)
	}
	sub := decode[ingress.BatchResponse](t, raw)
	// c-2 is accepted and a hanging item is running: the cancel then ends
	// the two hanging ones.
	before := waitBatch(t, b, sub.BatchID, func(v ingress.BatchView) bool {
		running := 0
		for _, it := range v.PendingItems {
			if it.State == "running" {
				running++
			}
		}
		return v.Accepted == 1 && running > 0
	})
	if before.Pending != 2 || len(before.PendingItems) != 2 || before.Complete {
		t.Fatalf("before the cancel: %+v", before)
	}
	status, raw = call(t, b, http.MethodPost, "/v1/batches/"+sub.BatchID+"/cancel", b.Token, nil)
	if status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, raw)
	}
	v := decode[ingress.BatchView](t, raw)
	if v.CanceledItems == nil || *v.CanceledItems != 2 || !v.Canceled || !v.Complete || v.Accepted != 1 || v.Failed != 2 || v.Counts["canceled"] != 2 {
		t.Fatalf("after the cancel: %s", raw)
	}
	for _, it := range v.FailedItems {
		if it.Outcome == nil || *it.Outcome != "canceled" || !strings.Contains(it.Reason, "canceled") || it.ItemID == "c-2" {
			t.Errorf("failed item %+v", it)
		}
	}
	// The running calls are stopped: their attempts end, recorded as what
	// they are, and nothing of theirs is published.
	deadline := time.Now().Add(60 * time.Second)
	for b.Count(t, `SELECT count(*) FROM attempts WHERE outcome IS NULL`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a canceled item's model call still runs after 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := b.Count(t, `SELECT count(*) FROM attempts a JOIN work w ON w.id = a.work_id
		WHERE w.state = 'canceled' AND a.outcome NOT IN ('canceled', 'stale_lease')`); n != 0 {
		t.Fatalf("%d attempts of canceled items ended otherwise", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM results r JOIN work w ON w.id = r.work_id WHERE w.state = 'canceled'`); n != 0 {
		t.Fatalf("%d results of canceled items", n)
	}
	// Canceling again ends nothing more; DELETE is the same.
	status, raw = call(t, b, http.MethodDelete, "/v1/batches/"+sub.BatchID, b.Token, nil)
	if again := decode[ingress.BatchView](t, raw); status != http.StatusOK || *again.CanceledItems != 0 || again.Counts["canceled"] != 2 {
		t.Fatalf("cancel again: %d %s", status, raw)
	}
	// The results say so, by item.
	_, raw = call(t, b, http.MethodGet, "/v1/batches/"+sub.BatchID+"/results", b.Token, nil)
	got := map[string]string{}
	for _, l := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		iv := decode[ingress.BatchItemView](t, l)
		got[iv.ItemID] = *iv.Outcome
	}
	if want := map[string]string{"c-1": "canceled", "c-2": "accepted", "c-3": "canceled"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	// The batch stream tells the cancel and that nothing is left.
	c, _, _ := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, "")
	evs := c.until(t, "complete")
	names := eventNames(evs)
	if !slices.Contains(names, "canceled") || names[0] != "queued" || len(evs) != 1+3+1+1 {
		t.Fatalf("events of a canceled batch: %v", names)
	}
}

func TestWorkEventsOverSSE(t *testing.T) {
	t.Parallel()
	b := eventsCell(t, cell.Options{})
	other := otherTenant(t, b)
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultRateLimit, Tenant: "acme", Match: "first call is refused", Times: 1, RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]string{"text": "the first call is refused, the second answers"})
	_, sub := b.Submit(t, ingress.SubmitRequest{Contract: "moderation", SourceID: "chat/1", Revision: "m1", Input: in})
	path := "/v1/work/" + sub.WorkID + "/events"

	// A subscriber reads two events and goes away: that cancels nothing.
	first, status, raw := openSSE(t, b, path, b.Token, "")
	if first == nil {
		t.Fatalf("work events: %d %s", status, raw)
	}
	head := []sseMsg{first.event(t), first.event(t)}
	first.close()
	if !slices.Equal(eventNames(head), []string{"queued", "running"}) {
		t.Fatalf("first events %v", eventNames(head))
	}
	// It comes back with the last id it had and gets the rest, once.
	again, _, _ := openSSE(t, b, path, b.Token, head[1].ID)
	tail := again.until(t, "accepted")
	got := append(slices.Clone(head), tail...)
	want := []string{"queued", "running", "attempt", "running", "attempt", "accepted"}
	if !slices.Equal(eventNames(got), want) {
		t.Fatalf("events %v, want %v", eventNames(got), want)
	}
	if ids := ids(got); len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) {
		t.Fatalf("an id twice: %v", ids)
	}
	var attempts []ingress.WorkEvent
	for _, m := range got {
		var ev ingress.WorkEvent
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil || ev.WorkID != sub.WorkID {
			t.Fatalf("%s: %s", m.Event, m.Data)
		}
		if m.Event == "attempt" {
			attempts = append(attempts, ev)
		}
		if m.Event == "accepted" && (ev.Outcome != "accepted" || len(ev.Output) == 0) {
			t.Fatalf("accepted event %s", m.Data)
		}
	}
	if len(attempts) != 2 || attempts[0].Outcome != "rate_limited" || attempts[1].Outcome != "ok" {
		t.Fatalf("attempt events %+v", attempts)
	}
	// Its outcome told, the stream ends with a final event.
	again.ends(t)
	// A new subscriber gets the same history with the same ids, and the
	// end; one resuming from the outcome gets 204: nothing more to come.
	fresh, _, _ := openSSE(t, b, path, b.Token, "")
	if all := fresh.until(t, "accepted"); !slices.Equal(ids(all), ids(got)) {
		t.Fatalf("a new subscriber: %v, want %v", ids(all), ids(got))
	}
	fresh.ends(t)
	if c, status, raw := openSSE(t, b, path, b.Token, got[len(got)-1].ID); c != nil || status != http.StatusNoContent {
		t.Fatalf("resumed after the outcome: %d %s, want 204", status, raw)
	}
	if v := b.Wait(t, sub.WorkID); *v.Outcome != "accepted" || len(v.Attempts) != 2 {
		t.Fatalf("work %s with %d attempts", *v.Outcome, len(v.Attempts))
	}

	// Refusals.
	if c, status, raw := openSSE(t, b, path, other, ""); c != nil || status != http.StatusNotFound || errorCode(t, raw) != "not_found" {
		t.Errorf("another tenant's work: %d %s", status, raw)
	}
	if c, status, raw := openSSE(t, b, path, b.Token, "w1.x"); c != nil || status != http.StatusBadRequest || errorCode(t, raw) != "invalid_last_event_id" {
		t.Errorf("bad Last-Event-ID: %d %s", status, raw)
	}
	if c, status, raw := openSSE(t, b, path, "not-a-token", ""); c != nil || status != http.StatusUnauthorized {
		t.Errorf("unknown token: %d %s", status, raw)
	}
}

func TestReviewQueue(t *testing.T) {
	t.Parallel()
	b := eventsCell(t, cell.Options{Classifier: classifier.Config{MaxAttempts: 2, BackoffBase: 50 * time.Millisecond,
		BackoffCap: 100 * time.Millisecond}})
	other := otherTenant(t, b)
	for _, f := range []sim.Fault{
		{Kind: sim.FaultBadEnum, Tenant: "acme", Match: "always out of vocabulary"},
		{Kind: sim.FaultServerError, Tenant: "acme", Match: "always failing"},
	} {
		if err := b.Sim.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(source, text, lane string) string {
		in, _ := json.Marshal(map[string]string{"text": text})
		_, r := b.Submit(t, ingress.SubmitRequest{Contract: "moderation", SourceID: source, Revision: "r1", Lane: lane, Input: in})
		return r.WorkID
	}
	human := submit("chat/human", "I want to end my life", "")
	rejected := submit("chat/rejected", "always out of vocabulary", "")
	exhausted := submit("chat/exhausted", "always failing here", "")
	batchExhausted := submit("chat/batch-exhausted", "always failing there", "batch")
	fine := submit("chat/fine", "have a nice day", "")

	// The human's work stream is open before anyone resolves it.
	stream, status, raw := openSSE(t, b, "/v1/work/"+human+"/events", b.Token, "")
	if stream == nil {
		t.Fatalf("events: %d %s", status, raw)
	}
	for id, want := range map[string]string{human: "accepted", rejected: "schema_rejected", exhausted: "retry_exhausted",
		batchExhausted: "retry_exhausted", fine: "accepted"} {
		if v := b.Wait(t, id); *v.Outcome != want {
			t.Fatalf("%s: %s (%s), want %s", id, *v.Outcome, v.Reason, want)
		}
	}
	evs := stream.until(t, "review")
	if n := eventNames(evs); n[len(n)-2] != "accepted" {
		t.Fatalf("events %v", n)
	}

	list := func(token, query string) ingress.ReviewList {
		t.Helper()
		status, raw := call(t, b, http.MethodGet, "/v1/reviews"+query, token, nil)
		if status != http.StatusOK {
			t.Fatalf("GET /v1/reviews%s: %d %s", query, status, raw)
		}
		return decode[ingress.ReviewList](t, raw)
	}
	all := list(b.Token, "")
	byWork := map[string]ingress.ReviewView{}
	for _, it := range all.Items {
		byWork[it.WorkID] = it
	}
	if len(all.Items) != 3 || byWork[human].Reason != "needs_human_review" || byWork[rejected].Reason != "schema_rejected" ||
		byWork[exhausted].Reason != "retry_exhausted" || byWork[exhausted].Lane != "interactive" || byWork[human].State != "open" {
		t.Fatalf("review queue %+v", all.Items)
	}
	if n := len(list(b.Token, "?reason=schema_rejected").Items); n != 1 {
		t.Errorf("reason filter: %d items", n)
	}
	if n := len(list(b.Token, "?contract=moderation&state=open").Items); n != 3 {
		t.Errorf("contract and state filter: %d items", n)
	}
	// Pages of one, by cursor.
	var paged []string
	for q := "?limit=1"; ; {
		page := list(b.Token, q)
		for _, it := range page.Items {
			paged = append(paged, it.ReviewID)
		}
		if page.Next == "" {
			break
		}
		q = "?limit=1&cursor=" + page.Next
	}
	if len(paged) != 3 || len(slices.Compact(slices.Sorted(slices.Values(paged)))) != 3 {
		t.Fatalf("paged %v", paged)
	}
	for _, q := range []string{"?state=pending", "?reason=accepted", "?contract=nope", "?limit=0", "?cursor=zz"} {
		if status, raw := call(t, b, http.MethodGet, "/v1/reviews"+q, b.Token, nil); status != http.StatusBadRequest || errorCode(t, raw) != "invalid_query" {
			t.Errorf("%s: %d %s", q, status, raw)
		}
	}
	if n := len(list(other, "").Items); n != 0 {
		t.Fatalf("another tenant sees %d review items", n)
	}

	// A review id is its work's, opaque: no sequence of the cell's shows
	// through, and no other spelling of it names the item.
	for w, it := range byWork {
		if it.ReviewID != "rv_"+strings.TrimPrefix(w, "w_") {
			t.Errorf("review of %s is %s", w, it.ReviewID)
		}
	}
	item := byWork[human]
	hex := strings.TrimPrefix(item.ReviewID, "rv_")
	for _, alias := range []string{"rv_" + strings.ToUpper(hex), "rv_0" + hex, "rv_+" + hex, "rv_" + hex[1:], "rv_ " + hex, "rv_1"} {
		path := "/v1/reviews/" + url.PathEscape(alias) + "/resolve"
		if status, raw := call(t, b, http.MethodPost, path, b.Token, ingress.ResolveRequest{Verdict: "approved"}); status != http.StatusNotFound {
			t.Errorf("resolve %q: %d %s, want 404", alias, status, raw)
		}
	}
	resolve := "/v1/reviews/" + item.ReviewID + "/resolve"
	for _, c := range []struct {
		body any
		code string
	}{
		{ingress.ResolveRequest{Verdict: "maybe"}, "invalid_verdict"},
		// Who resolves is the token's tenant: a name in the body, of
		// anyone, is refused, and so is an empty one.
		{[]byte(`{"by":"dev","verdict":"approved"}`), "invalid_resolver"},
		{[]byte(`{"by":"","verdict":"approved"}`), "invalid_resolver"},
		{[]byte(`{"by":null,"verdict":"approved"}`), "invalid_resolver"},
		{[]byte(`{"verdict":"approved","extra":1}`), "invalid_json"},
	} {
		if status, raw := call(t, b, http.MethodPost, resolve, b.Token, c.body); status != http.StatusBadRequest || errorCode(t, raw) != c.code {
			t.Errorf("resolve %v: %d %s", c.body, status, raw)
		}
	}
	if status, raw := call(t, b, http.MethodPost, resolve, other, ingress.ResolveRequest{Verdict: "approved"}); status != http.StatusNotFound {
		t.Fatalf("another tenant resolves: %d %s", status, raw)
	}
	status, raw = call(t, b, http.MethodPost, resolve, b.Token, ingress.ResolveRequest{Verdict: "approved", Note: "a person called back"})
	if rv := decode[ingress.ReviewView](t, raw); status != http.StatusOK || rv.State != "resolved" || rv.ResolvedBy != "acme" || rv.Verdict != "approved" ||
		rv.Resolution != "approved by tenant acme via the API" {
		t.Fatalf("resolve: %d %s", status, raw)
	}
	status, raw = call(t, b, http.MethodPost, resolve, b.Token, ingress.ResolveRequest{Verdict: "rejected"})
	if status != http.StatusConflict || errorCode(t, raw) != "already_resolved" || !strings.Contains(string(raw), "approved by tenant acme via the API") {
		t.Fatalf("resolve twice: %d %s", status, raw)
	}
	// The open stream tells of the resolution.
	if m := stream.event(t); m.Event != "resolved" || !strings.Contains(m.Data, `"by":"acme"`) {
		t.Fatalf("after the resolution: %+v", m)
	}
	// Its outcome told and its review resolved, the work's story is over.
	stream.ends(t)

	// The five states, per tenant, and the open queue: the resolved
	// answer no longer needs review; the two open items do, and nothing
	// else.
	status, raw = call(t, b, http.MethodGet, "/v1/views", b.Token, nil)
	vc := decode[ingress.ViewCounts](t, raw)
	if status != http.StatusOK || vc.OpenReviews == nil || *vc.OpenReviews != 2 || vc.States["rejected"] != 0 || vc.States["needs_review"] != 2 ||
		vc.States["accepted"] != 2 || vc.States["terminal"] != 1 || vc.States["running"] != 0 {
		t.Fatalf("views: %d %s", status, raw)
	}
	status, raw = call(t, b, http.MethodGet, "/v1/views", other, nil)
	if vc := decode[ingress.ViewCounts](t, raw); status != http.StatusOK || *vc.OpenReviews != 0 || vc.States["accepted"] != 0 {
		t.Fatalf("another tenant's views: %d %s", status, raw)
	}
	if n := b.Count(t, `SELECT count(*) FROM reviews`); n != 3 {
		t.Fatalf("%d review rows, want 3", n)
	}
}

// A thousand-item sweep with one item that cannot succeed reads as 999
// accepted and one failed, named, never as a thousand done.
func TestBatchOfAThousandNamesTheOneThatFailed(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultBadEnum, Tenant: "acme", Match: "message 0500 "}); err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	for i := range 1000 {
		texts[fmt.Sprintf("msg-%04d", i)] = fmt.Sprintf("message %04d of the sweep", i)
	}
	status, raw := call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", Items: moderationItems(texts)})
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", status, raw)
	}
	sub := decode[ingress.BatchResponse](t, raw)
	mid := waitBatch(t, b, sub.BatchID, func(v ingress.BatchView) bool { return v.Accepted > 0 && !v.Complete })
	if mid.Accepted+mid.Failed+mid.Pending+mid.Missing != 1000 || len(mid.PendingItems) != mid.Pending || len(mid.FailedItems) != mid.Failed {
		t.Fatalf("while running: accepted %d failed %d pending %d missing %d; %d failed and %d pending named",
			mid.Accepted, mid.Failed, mid.Pending, mid.Missing, len(mid.FailedItems), len(mid.PendingItems))
	}
	v := waitBatch(t, b, sub.BatchID, func(v ingress.BatchView) bool { return v.Complete })
	if v.Total != 1000 || v.Accepted != 999 || v.Failed != 1 || len(v.FailedItems) != 1 || v.FailedItems[0].ItemID != "msg-0500" ||
		*v.FailedItems[0].Outcome != "schema_rejected" || v.FailedItems[0].Reason == "" {
		t.Fatalf("complete: total %d accepted %d failed %d: %+v", v.Total, v.Accepted, v.Failed, v.FailedItems)
	}
	_, raw = call(t, b, http.MethodGet, "/v1/batches/"+sub.BatchID+"/results", b.Token, nil)
	lines := bytes.Split(bytes.TrimSpace(raw), []byte("\n"))
	if len(lines) != 1000 || !bytes.Contains(lines[500], []byte(`"itemId":"msg-0500","workId"`)) || !bytes.Contains(lines[500], []byte(`"outcome":"schema_rejected"`)) {
		t.Fatalf("%d result lines; line 500: %s", len(lines), lines[500])
	}
}

// A stream keeps to its credential whatever it sends: a suspended
// tenant's busy batch stream is closed, with a final event saying why,
// within the re-check interval and the token cache, not after a quiet
// spell.
func TestSuspendedTenantsStreamCloses(t *testing.T) {
	t.Parallel()
	const recheck, cache = 500 * time.Millisecond, 200 * time.Millisecond
	b := eventsCell(t, cell.Options{Ingress: ingress.Config{EventsRecheck: recheck, TokenCache: cache,
		EventsHeartbeat: time.Hour}})
	texts := map[string]string{}
	for i := range 400 {
		texts[fmt.Sprintf("item-%03d", i)] = fmt.Sprintf("message %d of a long sweep", i)
	}
	// Slow answers keep the batch going for a while: the stream is busy
	// the whole time.
	if err := b.Sim.SetCapacity(sim.Capacity{Latency: sim.Latency{Kind: sim.LatencyFixed, Base: 100 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	status, raw := call(t, b, http.MethodPost, "/v1/batches", b.Token, ingress.BatchRequest{Contract: "moderation", Items: moderationItems(texts)})
	if status != http.StatusAccepted {
		t.Fatalf("POST /v1/batches: %d %s", status, raw)
	}
	sub := decode[ingress.BatchResponse](t, raw)
	stream, status, raw := openSSE(t, b, "/v1/batches/"+sub.BatchID+"/events", b.Token, "")
	if stream == nil {
		t.Fatalf("batch events: %d %s", status, raw)
	}
	// Wait for items to be ending, so the stream is sending.
	for n := 0; n < 3; {
		if m := stream.event(t); m.Event == "accepted" {
			n++
		}
	}
	if err := b.Cell.Env.Store.SetStatus(context.Background(), b.Tenant, store.TenantSuspended); err != nil {
		t.Fatal(err)
	}
	suspended := time.Now()
	events := 0
	for {
		m := stream.event(t)
		if m.Event == "closed" {
			if !strings.Contains(m.Data, "tenant_suspended") {
				t.Fatalf("closed: %s, want the refusal's code", m.Data)
			}
			break
		}
		if m.Event == "complete" || m.Event == "end" {
			t.Fatalf("the batch completed (%s) before the suspension closed its stream", m.Event)
		}
		events++
	}
	took := time.Since(suspended)
	if limit := recheck + cache + time.Second; took > limit {
		t.Errorf("the stream closed %s after the suspension (%d events meanwhile), want within %s", took, events, limit)
	}
	if _, err := stream.next(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after closed: %v, want the stream to end", err)
	}
	t.Logf("closed %s after the suspension, %d events sent meanwhile", took.Round(time.Millisecond), events)
}
