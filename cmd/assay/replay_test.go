package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/telemetry"
	"assay.dev/schemas"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

// incident is a cell that went through a recorded incident: before the
// window one answer and one refusal, then inside it a burst of invalid
// answers, a provider stall past the ack wait and a duplicate storm beside
// two good answers.
type incident struct {
	b            *celltest.Bundle
	since, until time.Time
	// before are the items of the quiet time before the window.
	beforeOK, beforeBad string
	// burst ended schema_rejected, stall retry_exhausted; storm is the one
	// work item of the duplicate storm, clean the other good answer.
	burst        []string
	stall        string
	storm, clean string
}

func recordIncident(t *testing.T) *incident {
	log := &lockedBuffer{}
	b := celltest.Setup(t, cell.Options{Classifier: classifier.Config{AckWait: time.Second},
		Log: telemetry.NewLogger(log, "test", "us", slog.LevelInfo)})
	t.Setenv("ASSAY_NATS_URL", b.Cell.Env.Config.NATSURL)
	t.Setenv("ASSAY_DATABASE_URL", b.Cell.Env.Config.DatabaseURL)
	t.Setenv("ASSAY_REGION", "us")
	items := evalset.Items()
	in := &incident{b: b}
	submit := func(it evalset.Item, title, source string, deadline int, fault string) string {
		if fault != "" {
			// The answer and its repair are both invalid.
			if err := b.Sim.AddFault(sim.Fault{Kind: fault, Tenant: "acme", Match: title, Times: 2}); err != nil {
				t.Fatal(err)
			}
		}
		req := celltest.CodeReview(it, title)
		req.SourceID, req.DeadlineSeconds = source, deadline
		_, r := b.Submit(t, req)
		return r.WorkID
	}
	in.beforeOK = submit(items[0], "quiet hour", "shop/quiet#1", 0, "")
	in.beforeBad = submit(items[1], "quiet hour refusal", "shop/quiet#2", 0, sim.FaultInvalidJSON)
	b.Wait(t, in.beforeOK)
	b.Wait(t, in.beforeBad)
	waitOutbox(t, b)
	in.since = time.Now()

	for i := range 3 {
		title := "burst " + strconv.Itoa(i)
		in.burst = append(in.burst, submit(items[2+i], title, "shop/burst#"+strconv.Itoa(i), 0, sim.FaultInvalidJSON))
	}
	// The burst ends before the stall comes: with a 4 s deadline the stall
	// may wait 400 ms, and admission would rightly refuse it behind them.
	for _, id := range in.burst {
		b.Wait(t, id)
	}
	// The provider stalls longer than the ack wait: the announcement is
	// delivered again while the call hangs, until the deadline ends it.
	if err := b.Sim.AddFault(sim.Fault{Kind: sim.FaultHang, Tenant: "acme", Match: "stalled call", Times: 1}); err != nil {
		t.Fatal(err)
	}
	in.stall = submit(items[5], "stalled call", "shop/stall#1", 4, "")
	storm := celltest.CodeReview(items[4], "duplicate storm")
	storm.SourceID = "shop/storm#1"
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() { _, r := b.Submit(t, storm); ids[i] = r.WorkID })
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("the duplicate storm made two work items: %s and %s", ids[0], id)
		}
	}
	in.storm = ids[0]
	in.clean = submit(items[8], "clean change", "shop/clean#1", 0, "")
	for _, id := range append(slices.Clone(in.burst), in.stall, in.storm, in.clean) {
		b.Wait(t, id)
	}
	waitOutbox(t, b)
	in.until = time.Now()
	// The stall outlasted the ack wait: the announcement came again while
	// the call hung, and the claim fence turned it away (or, near the
	// deadline, the classifier passed it over).
	if !log.has(`"key":"`+in.stall+`","outcome":"claim_lost"`) && !log.has(`"key":"`+in.stall+`","outcome":"passed_over"`) {
		t.Fatalf("the stalled item's announcement was not delivered again during the stall")
	}
	for _, c := range []struct {
		ids   []string
		state string
	}{{in.burst, "schema_rejected"}, {[]string{in.stall}, "retry_exhausted"}, {[]string{in.storm, in.clean, in.beforeOK}, "accepted"},
		{[]string{in.beforeBad}, "schema_rejected"}} {
		for _, id := range c.ids {
			if s := in.state(t, id); s != c.state {
				t.Fatalf("recorded incident: %s is %s, want %s", id, s, c.state)
			}
		}
	}
	return in
}

// lockedBuffer is the cell's log, written by many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

// waitOutbox waits until the cell has announced every outcome its work
// reached (the committer's sweep writes those it did not commit itself) and
// published everything it wrote.
func waitOutbox(t *testing.T, b *celltest.Bundle) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for b.Count(t, `SELECT count(*) FROM work WHERE state NOT IN ('queued', 'running') AND outcome_announced_at IS NULL`)+
		b.Count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("outcomes still unannounced or outbox rows unpublished after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (in *incident) state(t *testing.T, id string) string {
	var s string
	if err := in.b.DB.QueryRow(context.Background(), `SELECT state FROM work WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (in *incident) window() []string {
	return []string{"--since", in.since.UTC().Format(time.RFC3339Nano), "--until", in.until.UTC().Format(time.RFC3339Nano)}
}

// assay runs an assay command's function and returns what it printed.
func assay(t *testing.T, cmd func(context.Context, []string, *bytes.Buffer) error, args ...string) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := cmd(context.Background(), args, &out); err != nil {
		t.Fatalf("assay %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.Bytes()
}

func replay(ctx context.Context, args []string, out *bytes.Buffer) error {
	return replayCmd(ctx, args, out)
}
func streams(ctx context.Context, args []string, out *bytes.Buffer) error {
	return streamsCmd(ctx, args, out)
}
func work(ctx context.Context, args []string, out *bytes.Buffer) error {
	return workCmd(ctx, args, out)
}

func TestReplayIncident(t *testing.T) {
	in := recordIncident(t)
	b := in.b
	ctx := context.Background()

	t.Run("dump", func(t *testing.T) {
		out := assay(t, replay, "dump")
		got := map[string]uint64{}
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var m ReplayMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("dump line %q: %v", sc.Text(), err)
			}
			if m.DecodeError != "" || m.Sequence == 0 || m.Time.IsZero() || len(m.Headers["Nats-Msg-Id"]) != 1 {
				t.Fatalf("dump line without what it must carry: %s", sc.Text())
			}
			got[m.Stream]++
			if strings.HasPrefix(m.Stream, b.Names().Stream(event.KindAttempt)) && bytes.Contains(m.Payload, []byte(`"result"`)) &&
				!bytes.Contains(m.Payload, []byte(`"leaseToken":"masked:sha256:`)) {
				t.Errorf("an ATTEMPT message dumped with its result's lease token: %s", m.Payload)
			}
		}
		var tokens []string
		rows, err := b.DB.Query(ctx, `SELECT lease_token::text FROM attempts`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var tok string
			_ = rows.Scan(&tok)
			tokens = append(tokens, tok)
		}
		if len(tokens) == 0 {
			t.Fatal("no attempt has a lease token: the masking is checked against nothing")
		}
		for _, tok := range tokens {
			if bytes.Contains(out, []byte(tok)) {
				t.Errorf("the dump carries lease token %s", tok)
			}
		}
		for _, kind := range event.Kinds {
			name := b.Names().Stream(kind)
			st, err := b.Cell.Env.JS.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			// RESULT holds only what classifiers of earlier releases
			// published: nothing here.
			if held := st.CachedInfo().State.Msgs; got[name] != held || (held == 0) != (kind == event.KindResult) {
				t.Errorf("%s: dumped %d message(s), the stream holds %d", name, got[name], held)
			}
			// The replay's ordered consumer is gone; the durables stay.
			for ci := range st.ListConsumers(ctx).Info() {
				if ci.Config.Durable == "" {
					t.Errorf("%s: consumer %s left behind", name, ci.Name)
				}
			}
		}
		// One work item's messages, by id.
		out = assay(t, replay, "dump", "--work", in.stall, "--stream", "work")
		if n := bytes.Count(out, []byte("\n")); n < 1 || !bytes.Contains(out, []byte(in.stall)) {
			t.Errorf("dump --work %s: %d line(s)", in.stall, n)
		}
		// A work id the streams hold nothing of is an error, not "0
		// selected", in every mode.
		for _, mode := range []string{"dump", "revalidate", "redrive"} {
			var none bytes.Buffer
			err := replayCmd(ctx, []string{mode, "--work", in.stall + ",w_000000000000000000000000"}, &none)
			if err == nil || !strings.Contains(err.Error(), "--work w_000000000000000000000000: no message of it") {
				t.Errorf("%s --work of unknown work: %v", mode, err)
			}
		}
	})

	t.Run("streams", func(t *testing.T) {
		var views []StreamView
		if err := json.Unmarshal(assay(t, streams, "--json"), &views); err != nil {
			t.Fatal(err)
		}
		if len(views) != len(event.Kinds) {
			t.Fatalf("%d streams, want %d", len(views), len(event.Kinds))
		}
		found := map[string]bool{}
		for _, v := range views {
			for _, c := range v.Consumers {
				if c.Name == b.Names().WorkConsumer(event.Interactive) || c.Name == b.Names().OutcomeConsumer() {
					found[v.Stream+"/"+c.Name] = true
					if c.Pending != 0 || c.AckPending != 0 {
						t.Errorf("%s: pending %d, ack pending %d after the incident settled", c.Name, c.Pending, c.AckPending)
					}
				}
			}
		}
		for _, want := range []string{b.Names().Stream(event.KindWork) + "/" + b.Names().WorkConsumer(event.Interactive),
			b.Names().Stream(event.KindOutcome) + "/" + b.Names().OutcomeConsumer()} {
			if !found[want] {
				t.Errorf("%s is not listed: %+v", want, views)
			}
		}
		// OUTCOME is dumped as any stream is.
		out := assay(t, replay, "dump", "--stream", "outcome", "--work", in.clean)
		if !bytes.Contains(out, []byte(`"outcome":"accepted"`)) || !bytes.Contains(out, []byte(b.Names().Stream(event.KindOutcome))) {
			t.Errorf("dump --stream outcome --work %s:\n%s", in.clean, out)
		}
	})

	t.Run("work show", func(t *testing.T) {
		var s WorkStory
		if err := json.Unmarshal(assay(t, work, "show", in.stall, "--json"), &s); err != nil {
			t.Fatal(err)
		}
		if s.Work.State != "retry_exhausted" || len(s.Attempts) != 1 || s.Attempts[0].Outcome != "timeout" {
			t.Fatalf("the stalled item's story: %+v", s)
		}
		kinds := map[string]int{}
		for _, m := range s.Messages {
			kinds[strings.Split(m.Stream, "_")[1]]++
		}
		// Its first announcement has no row (the ingress published it), nor
		// have the ATTEMPT events kept on its attempts' rows.
		published := b.Count(t, `SELECT count(*) + 1 + (SELECT count(*) FROM attempts WHERE work_id = $1 AND event IS NOT NULL)
			FROM outbox WHERE msg_id LIKE $1 || '.%' OR msg_id IN (SELECT id::text FROM attempts WHERE work_id = $1)`, in.stall)
		if len(s.Messages) != published || kinds["WORK"] < 1 || kinds["RESULT"] != 0 || kinds["ATTEMPT"] != 1 {
			t.Errorf("messages %v (%d), the outbox published %d", kinds, len(s.Messages), published)
		}
		if !slices.ContainsFunc(s.Decisions, func(d ingress.Decision) bool { return d.What == "ended retry_exhausted" }) {
			t.Errorf("decisions do not say how it ended: %+v", s.Decisions)
		}
		text := string(assay(t, work, "show", in.burst[0]))
		for _, want := range []string{"schema_rejected", "invalid_output", "answer", "decisions", "ATTEMPT", "(its text: --answers)"} {
			if !strings.Contains(text, want) {
				t.Errorf("work show %s does not show %q:\n%s", in.burst[0], want, text)
			}
		}
		// The answers' text only when asked for.
		var plain, withAnswers WorkStory
		if err := json.Unmarshal(assay(t, work, "show", in.burst[0], "--json", "--no-messages"), &plain); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(assay(t, work, "show", in.burst[0], "--json", "--no-messages", "--answers"), &withAnswers); err != nil {
			t.Fatal(err)
		}
		for i, a := range plain.Attempts {
			if a.Excerpt != "" || a.AnswerBytes == 0 || withAnswers.Attempts[i].Excerpt == "" {
				t.Errorf("attempt %d: excerpt %q by default, %q with --answers (%d bytes)", a.Number, a.Excerpt, withAnswers.Attempts[i].Excerpt, a.AnswerBytes)
			}
		}
	})

	t.Run("work list", func(t *testing.T) {
		var page struct {
			Items []ingress.WorkRow `json:"items"`
			Next  string            `json:"next"`
		}
		if err := json.Unmarshal(assay(t, work, "list", "--state", "schema_rejected", "--json"), &page); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range page.Items {
			ids = append(ids, w.ID)
		}
		if want := sorted(append(slices.Clone(in.burst), in.beforeBad)); !slices.Equal(sorted(ids), want) || page.Next != "" {
			t.Errorf("work list --state schema_rejected: %v (next %q), want %v", ids, page.Next, want)
		}
		page.Items = nil
		if err := json.Unmarshal(assay(t, work, append([]string{"list", "--state", "schema_rejected,retry_exhausted", "--json"}, in.window()...)...), &page); err != nil {
			t.Fatal(err)
		}
		ids = nil
		for _, w := range page.Items {
			ids = append(ids, w.ID)
		}
		if want := sorted(append(slices.Clone(in.burst), in.stall)); !slices.Equal(sorted(ids), want) {
			t.Errorf("work list --state schema_rejected,retry_exhausted within the window: %v, want %v", ids, want)
		}
		// GET /v1/work, two at a time: every one of acme's items once, in
		// the order they were created.
		var all []string
		cursor := ""
		for range 10 {
			u := b.Cell.URL + "/v1/work?limit=2&since=" + url.QueryEscape(in.since.UTC().Format(time.RFC3339Nano))
			if cursor != "" {
				u += "&cursor=" + cursor
			}
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			req.Header.Set("Authorization", "Bearer "+b.Token)
			resp, err := b.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var l ingress.WorkList
			err = json.NewDecoder(resp.Body).Decode(&l)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /v1/work: HTTP %d: %v", resp.StatusCode, err)
			}
			for _, w := range l.Items {
				all = append(all, w.WorkID)
			}
			if cursor = l.Next; cursor == "" {
				break
			}
		}
		want := append(slices.Clone(in.burst), in.stall, in.storm, in.clean)
		if !slices.Equal(all, want) {
			t.Errorf("GET /v1/work pages: %v, want %v", all, want)
		}
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/work?state=finished", nil)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/work?state=finished: HTTP %d, want 400", resp.StatusCode)
		}
	})

	t.Run("revalidate", func(t *testing.T) {
		before := b.Count(t, `SELECT count(*) FROM outbox`)
		var same Revalidation
		if err := json.Unmarshal(assay(t, replay, append([]string{"revalidate", "--json"}, in.window()...)...), &same); err != nil {
			t.Fatal(err)
		}
		// Burst: two invalid answers each; storm and clean: one good one.
		if same.Works != 6 || same.Checked != 3*2+2 || len(same.Changed) != 0 {
			t.Fatalf("revalidate with today's gate: %d work, %d checked, changed %+v, skipped %v", same.Works, same.Checked, same.Changed, same.Skipped)
		}
		// A contract version that allows one finding at most.
		dir := tightened(t)
		var tight Revalidation
		if err := json.Unmarshal(assay(t, replay, append([]string{"revalidate", "--json", "--contracts", dir}, in.window()...)...), &tight); err != nil {
			t.Fatal(err)
		}
		var want []string
		rows, err := b.DB.Query(ctx, `SELECT r.work_id FROM results r JOIN work w ON w.id = r.work_id
			WHERE r.findings > 1 AND w.id = ANY($1) ORDER BY r.work_id`, []string{in.storm, in.clean})
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			_ = rows.Scan(&id)
			want = append(want, id)
		}
		if rows.Err() != nil || len(want) == 0 {
			t.Fatalf("no accepted answer in the window has two findings (%v): the tightened rule tests nothing", rows.Err())
		}
		var got []string
		for _, v := range tight.Changed {
			if v.Was != "ok" || v.Now != "fail" || !strings.Contains(v.NowReason, "schema.violation") {
				t.Errorf("changed verdict %+v", v)
			}
			got = append(got, v.WorkID)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("the tightened rule changed %v, want exactly %v", got, want)
		}
		if n := b.Count(t, `SELECT count(*) FROM outbox`); n != before {
			t.Errorf("revalidate wrote: %d outbox rows, %d before", n, before)
		}
	})

	t.Run("redrive", func(t *testing.T) {
		attempts := b.Count(t, `SELECT count(*) FROM attempts`)
		outbox := b.Count(t, `SELECT count(*) FROM outbox`)
		var dry Redrive
		if err := json.Unmarshal(assay(t, replay, append([]string{"redrive", "--json"}, in.window()...)...), &dry); err != nil {
			t.Fatal(err)
		}
		chosen := append(slices.Clone(in.burst), in.stall)
		if !dry.DryRun || !slices.Equal(redrivenIDs(dry), sorted(chosen)) || dry.Selected != 6 {
			t.Fatalf("dry run: %+v, want %v of 6", dry, sorted(chosen))
		}
		if b.Count(t, `SELECT count(*) FROM attempts`) != attempts || b.Count(t, `SELECT count(*) FROM outbox`) != outbox ||
			b.Count(t, `SELECT count(*) FROM redrives`) != 0 {
			t.Fatal("the dry run wrote")
		}
		// A count the selection does not hold writes nothing.
		var wrong bytes.Buffer
		if err := replayCmd(ctx, append([]string{"redrive", "--confirm", "3"}, in.window()...), &wrong); err == nil ||
			!strings.Contains(err.Error(), "nothing was written") || b.Count(t, `SELECT count(*) FROM redrives`) != 0 {
			t.Fatalf("redrive --confirm 3 of 4: %v", err)
		}
		var done Redrive
		if err := json.Unmarshal(assay(t, replay, append([]string{"redrive", "--json", "--confirm", "4"}, in.window()...)...), &done); err != nil {
			t.Fatal(err)
		}
		if done.DryRun || !slices.Equal(redrivenIDs(done), sorted(chosen)) {
			t.Fatalf("redrive: %+v", done)
		}
		for _, id := range chosen {
			if v := b.Wait(t, id); *v.Outcome != "accepted" {
				t.Errorf("redriven %s ended %s (%s)", id, *v.Outcome, v.Reason)
			}
		}
		waitOutbox(t, b)
		// Exactly the chosen items ran again, once each: one more attempt
		// each, the others untouched.
		for id, want := range map[string]int{in.burst[0]: 3, in.burst[1]: 3, in.burst[2]: 3, in.stall: 2,
			in.beforeBad: 2, in.storm: 1, in.clean: 1, in.beforeOK: 1} {
			if n := b.Count(t, `SELECT count(*) FROM attempts WHERE work_id = $1`, id); n != want {
				t.Errorf("%s: %d attempt(s), want %d", id, n, want)
			}
		}
		attempts = b.Count(t, `SELECT count(*) FROM attempts`)
		outbox = b.Count(t, `SELECT count(*) FROM outbox`)
		var again Redrive
		if err := json.Unmarshal(assay(t, replay, append([]string{"redrive", "--json", "--confirm", "0"}, in.window()...)...), &again); err != nil {
			t.Fatal(err)
		}
		if len(again.Redriven) != 0 || len(again.Refused["in state accepted"]) != 6 {
			t.Errorf("second redrive: %+v", again)
		}
		if b.Count(t, `SELECT count(*) FROM attempts`) != attempts || b.Count(t, `SELECT count(*) FROM outbox`) != outbox {
			t.Error("the second redrive made a new attempt or a new announcement")
		}
		// An ending is redriven once: the redriven items' rows say so.
		if n := b.Count(t, `SELECT count(*) FROM redrives`); n != 4 {
			t.Errorf("%d redrive row(s), want 4", n)
		}
		var s WorkStory
		if err := json.Unmarshal(assay(t, work, "show", in.stall, "--json", "--no-messages"), &s); err != nil {
			t.Fatal(err)
		}
		if len(s.Redrives) != 1 || s.Redrives[0].EndedState != "retry_exhausted" || s.Work.State != "accepted" ||
			!slices.ContainsFunc(s.Decisions, func(d ingress.Decision) bool { return d.What == "ended retry_exhausted" && d.Reason != "" }) {
			t.Errorf("work show after the redrive: %+v, decisions %+v", s.Redrives, s.Decisions)
		}
	})
}

func redrivenIDs(r Redrive) []string {
	var ids []string
	for _, w := range r.Redriven {
		ids = append(ids, w.WorkID)
	}
	return sorted(ids)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// tightened writes today's contracts with the code-review contract allowing
// one finding at most.
func tightened(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	err := fs.WalkDir(schemas.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := fs.ReadFile(schemas.FS, p)
		if err != nil {
			return err
		}
		if p == "code-review.json" {
			before := raw
			raw = bytes.Replace(raw, []byte(`"maxItems": 20`), []byte(`"maxItems": 1`), 1)
			if bytes.Equal(before, raw) {
				t.Fatal("code-review.json has no findings maxItems to tighten")
			}
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), raw, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
