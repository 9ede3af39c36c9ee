package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
	"assay.dev/services/ingress"
)

// dumpLines reads replay dump's JSON lines.
func dumpLines(t *testing.T, out []byte) []ReplayMsg {
	t.Helper()
	var msgs []ReplayMsg
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var m ReplayMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("dump line %q: %v", sc.Text(), err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// A tenant moved from cell us to cell us-2 of one region (one NATS server)
// left its earlier events in us's streams: assay replay --tenant and assay
// work show, run in us-2, read each cell's streams for the time it served
// the tenant and name the cell of each message; work only in us's database
// is read from there (ASSAY_DATABASE_URL_US), saying so.
func TestReplayFollowsAMovedTenant(t *testing.T) {
	natsURL := testenv.NATS(t)
	a := celltest.SetupOn(t, cell.Options{}, nil, natsURL)
	b := celltest.SetupOn(t, cell.Options{Config: config.Config{Region: "us", Regions: config.DefaultRegions, Cell: "us-2"}}, nil, natsURL)
	ctx := context.Background()
	items := evalset.Items()

	// Before the move acme is served by us, the region's own cell.
	_, before := a.Submit(t, celltest.CodeReview(items[0], "before the move"))
	a.Wait(t, before.WorkID)
	waitOutbox(t, a)

	t.Setenv("ASSAY_NATS_URL", natsURL)
	t.Setenv("ASSAY_REGION", "us")
	t.Setenv("ASSAY_PLACEMENT_NATS_URL", "")
	t.Setenv("ASSAY_NATS_URL_US", "")
	t.Setenv("ASSAY_NATS_URL_US_2", "")
	t.Setenv("ASSAY_CELL", "us")
	t.Setenv("ASSAY_DATABASE_URL", a.Cell.Env.Config.DatabaseURL)
	// A tenant that never moved is read from this cell's streams, as ever:
	// no message names a cell.
	unmoved := assay(t, replay, "dump", "--tenant", "acme")
	if len(dumpLines(t, unmoved)) == 0 || bytes.Contains(unmoved, []byte(`"cell"`)) {
		t.Fatalf("dump --tenant acme before any move:\n%s", unmoved)
	}

	// The cut-over: acme's events from now are made in us-2.
	kv, err := placement.Bucket(ctx, a.Cell.Env.JS, a.Names().PlacementBucket("us"), 1)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	if err := placement.RecordHop(ctx, kv, "acme", placement.Hop{From: "us", To: "us-2", At: at}); err != nil {
		t.Fatal(err)
	}
	if err := placement.Place(ctx, kv, "acme", "us-2"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/views", nil)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && resp.Header.Get(ingress.ServedBy) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cell us-2 does not serve acme within 20s of its placement: HTTP %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, after := b.Submit(t, celltest.CodeReview(items[1], "after the move"))
	b.Wait(t, after.WorkID)
	waitOutbox(t, b)

	// From here on, the operator stands in us-2.
	t.Setenv("ASSAY_CELL", "us-2")
	t.Setenv("ASSAY_DATABASE_URL", b.Cell.Env.Config.DatabaseURL)
	t.Setenv("ASSAY_DATABASE_URL_US", a.Cell.Env.Config.DatabaseURL)
	names := map[string]event.Names{"us": a.Names(), "us-2": b.Names()}

	t.Run("dump", func(t *testing.T) {
		msgs := dumpLines(t, assay(t, replay, "dump", "--tenant", "acme"))
		cellOf := map[string]map[string]bool{} // work id: the cells its messages came from
		last := map[string]ReplayMsg{}         // by stream kind
		for _, m := range msgs {
			if m.Cell != "us" && m.Cell != "us-2" {
				t.Fatalf("a message names cell %q: %+v", m.Cell, m)
			}
			kind := ""
			for _, k := range event.Kinds {
				if m.Stream == names[m.Cell].Stream(k) {
					kind = k
				}
			}
			if kind == "" {
				t.Fatalf("a message of cell %s from stream %s, not one of that cell's", m.Cell, m.Stream)
			}
			if !strings.HasPrefix(m.Subject, names[m.Cell].Prefix(kind)) || !strings.HasSuffix(m.Subject, ".acme") {
				t.Errorf("a message of cell %s on subject %s", m.Cell, m.Subject)
			}
			// us's before the move, us-2's after; each stream in time order.
			if (m.Cell == "us") != m.Time.Before(at) {
				t.Errorf("a message of cell %s at %s, the move at %s", m.Cell, m.Time, at)
			}
			if p, ok := last[kind]; ok && m.Time.Before(p.Time) {
				t.Errorf("%s: %s (cell %s) after %s (cell %s)", kind, m.Time, m.Cell, p.Time, p.Cell)
			}
			last[kind] = m
			if m.WorkID != "" {
				if cellOf[m.WorkID] == nil {
					cellOf[m.WorkID] = map[string]bool{}
				}
				cellOf[m.WorkID][m.Cell] = true
			}
		}
		for id, want := range map[string]string{before.WorkID: "us", after.WorkID: "us-2"} {
			if got := cellOf[id]; len(got) != 1 || !got[want] {
				t.Errorf("%s's messages came from cells %v, want %s alone", id, got, want)
			}
		}
		// Every message of acme both cells hold, once: OUTCOME has one per work.
		outcomes := 0
		for _, m := range msgs {
			if strings.HasSuffix(m.Stream, "_"+event.KindOutcome+"_US") || strings.HasSuffix(m.Stream, "_"+event.KindOutcome+"_US_2") {
				outcomes++
			}
		}
		if outcomes != 2 {
			t.Errorf("%d OUTCOME message(s), want one per work item (2)", outcomes)
		}

		// --work finds work of the cell before the move too.
		one := dumpLines(t, assay(t, replay, "dump", "--tenant", "acme", "--work", before.WorkID))
		if len(one) == 0 {
			t.Fatal("dump --tenant acme --work of the work made before the move: nothing")
		}
		for _, m := range one {
			if m.WorkID != before.WorkID || m.Cell != "us" {
				t.Errorf("dump --work %s: %+v", before.WorkID, m)
			}
		}
		// A window inside one cell's time reads that cell alone.
		win := dumpLines(t, assay(t, replay, "dump", "--tenant", "acme", "--since", at.Format(time.RFC3339Nano)))
		for _, m := range win {
			if m.Cell != "us-2" {
				t.Errorf("dump --since the move: a message of cell %s", m.Cell)
			}
		}
		if len(win) == 0 {
			t.Error("dump --since the move: nothing")
		}
		// Sequences are per stream of one cell.
		var out bytes.Buffer
		err := replayCmd(ctx, []string{"dump", "--tenant", "acme", "--stream", "work", "--seq", "1-"}, &out)
		if err == nil || !strings.Contains(err.Error(), "moved between cells") {
			t.Errorf("dump --seq of a tenant that moved: %v", err)
		}
	})

	t.Run("revalidate", func(t *testing.T) {
		var rep Revalidation
		if err := json.Unmarshal(assay(t, replay, "revalidate", "--tenant", "acme", "--json"), &rep); err != nil {
			t.Fatal(err)
		}
		cells := map[string]bool{}
		for _, s := range rep.Streams {
			cells[s.Cell] = true
			if s.Stream != names[s.Cell].Stream(event.KindAttempt) && s.Stream != names[s.Cell].Stream(event.KindResult) {
				t.Errorf("revalidate read %s as cell %s's", s.Stream, s.Cell)
			}
		}
		if !cells["us"] || !cells["us-2"] || len(cells) != 2 {
			t.Errorf("revalidate --tenant acme read the streams of cells %v", cells)
		}
	})

	t.Run("work show", func(t *testing.T) {
		var s WorkStory
		if err := json.Unmarshal(assay(t, work, "show", before.WorkID, "--json"), &s); err != nil {
			t.Fatal(err)
		}
		if s.Cell != "us" || s.Work.ID != before.WorkID || s.Work.State != "accepted" || s.MessagesError != "" {
			t.Fatalf("work show of work in us's database alone: cell %q, %+v, messages error %q", s.Cell, s.Work, s.MessagesError)
		}
		kinds := map[string]bool{}
		for _, m := range s.Messages {
			if m.Cell != "us" || m.WorkID != before.WorkID {
				t.Errorf("work show %s: a message %+v", before.WorkID, m)
			}
			for _, k := range event.Kinds {
				if m.Stream == a.Names().Stream(k) {
					kinds[k] = true
				}
			}
		}
		if !kinds[event.KindWork] || !kinds[event.KindOutcome] {
			t.Errorf("work show %s: messages of streams %v", before.WorkID, kinds)
		}
		text := string(assay(t, work, "show", before.WorkID))
		for _, want := range []string{"read from cell us's database: not in this cell's (us-2) database", "work " + before.WorkID, "(cell us)"} {
			if !strings.Contains(text, want) {
				t.Errorf("work show %s lacks %q:\n%s", before.WorkID, want, text)
			}
		}
		// Work of this cell is shown as ever; its messages name their cell.
		var here WorkStory
		if err := json.Unmarshal(assay(t, work, "show", after.WorkID, "--json"), &here); err != nil {
			t.Fatal(err)
		}
		if here.Cell != "" || len(here.Messages) == 0 {
			t.Errorf("work show of this cell's work: cell %q, %d message(s)", here.Cell, len(here.Messages))
		}
		for _, m := range here.Messages {
			if m.Cell != "us-2" {
				t.Errorf("work show %s: a message of cell %q", after.WorkID, m.Cell)
			}
		}
		// Without the other cell's database, work show says what to set.
		t.Setenv("ASSAY_DATABASE_URL_US", "")
		var out bytes.Buffer
		err := workCmd(ctx, []string{"show", before.WorkID}, &out)
		if err == nil || !strings.Contains(err.Error(), "no work") || !strings.Contains(err.Error(), "ASSAY_DATABASE_URL_US") {
			t.Errorf("work show without ASSAY_DATABASE_URL_US: %v", err)
		}
		t.Setenv("ASSAY_DATABASE_URL_US", a.Cell.Env.Config.DatabaseURL)

		// This cell holds a pointer to the work (state elsewhere) while us
		// finishes it: it is read from us.
		_, err = b.DB.Exec(ctx, `INSERT INTO work (id, tenant_id, region, contract, schema_version, taxonomy_version, source_id,
			revision, lane, input, content_digest, state, deadline_at, outcome_announced_at)
			VALUES ($1, 'acme', 'us', 'code-review', 'code-review/2', 'x', 'moved/pointer#1', 'r1', 'interactive', '', 'sha256:00',
			'elsewhere', now() + interval '1 hour', now())`, before.WorkID)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23514" {
			t.Skip("the schema has no state elsewhere yet")
		}
		if err != nil {
			t.Fatal(err)
		}
		var moved WorkStory
		if err := json.Unmarshal(assay(t, work, "show", before.WorkID, "--json", "--no-messages"), &moved); err != nil {
			t.Fatal(err)
		}
		if moved.Cell != "us" || moved.Work.State != "accepted" {
			t.Errorf("work show of a pointer: cell %q, state %s", moved.Cell, moved.Work.State)
		}
		text = string(assay(t, work, "show", before.WorkID, "--no-messages"))
		if !strings.Contains(text, "read from cell us's database: this cell (us-2) holds only a pointer to it (state elsewhere)") {
			t.Errorf("work show of a pointer:\n%s", text)
		}
	})
}

// A tenant's hops give each cell the time it served the tenant, whatever
// order they are kept in; a selection's window meets those times.
func TestSpansOfHops(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	if sp := spans(nil); sp != nil {
		t.Errorf("spans of no hop: %+v", sp)
	}
	// us → us-2 → us: us twice.
	got := spans([]placement.Hop{{From: "us-2", To: "us", At: t1}, {From: "us", To: "us-2", At: t0}})
	want := []span{{cell: "us", until: t0}, {cell: "us-2", since: t0, until: t1}, {cell: "us", since: t1}}
	if len(got) != len(want) {
		t.Fatalf("spans: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].cell != want[i].cell || !got[i].since.Equal(want[i].since) || !got[i].until.Equal(want[i].until) {
			t.Errorf("span %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, c := range []struct {
		name         string
		since, until time.Time
		sp           span
		ok           bool
		from, to     time.Time
	}{
		{"open selection, first span", time.Time{}, time.Time{}, want[0], true, time.Time{}, t0},
		{"open selection, last span", time.Time{}, time.Time{}, want[2], true, t1, time.Time{}},
		{"window inside a span", t0.Add(time.Minute), t0.Add(2 * time.Minute), want[1], true, t0.Add(time.Minute), t0.Add(2 * time.Minute)},
		{"window after a span", t1.Add(time.Minute), time.Time{}, want[1], false, time.Time{}, time.Time{}},
		{"window ending at a span's start", time.Time{}, t0, want[1], false, time.Time{}, time.Time{}},
		{"window across spans", t0.Add(-time.Minute), t2, want[1], true, t0, t1},
	} {
		s, ok := selection{since: c.since, until: c.until}.within(c.sp)
		if ok != c.ok || (ok && (!s.since.Equal(c.from) || !s.until.Equal(c.to))) {
			t.Errorf("%s: %v [%s, %s), want %v [%s, %s)", c.name, ok, s.since, s.until, c.ok, c.from, c.to)
		}
	}
}
