package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/store"
)

// rfc3339 is RFC 3339's date-time (section 5.6), which CloudEvents' time
// attribute takes.
var rfc3339 = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$`)

// checkCloudEvent holds one JSON-format event to CloudEvents 1.0: the
// required attributes id, source, specversion "1.0" and type as non-empty
// strings; the optional ones of the right type where present (subject a
// non-empty string, time an RFC 3339 timestamp, datacontenttype a media
// type, dataschema an absolute URI); source a URI-reference; every other
// member an extension attribute (lower-case letters and digits, a string,
// number or boolean) or the data, which with application/json is JSON
// itself; not data and data_base64 both. It returns the event's members.
func checkCloudEvent(t *testing.T, raw []byte) map[string]json.RawMessage {
	t.Helper()
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, raw)
	}
	str := func(name string, required bool) (string, bool) {
		t.Helper()
		v, ok := ev[name]
		if !ok {
			if required {
				t.Errorf("no %s: %s", name, raw)
			}
			return "", false
		}
		var s string
		if json.Unmarshal(v, &s) != nil || s == "" {
			t.Errorf("%s is %s, not a non-empty string", name, v)
		}
		return s, true
	}
	for _, name := range []string{"id", "source", "specversion", "type"} {
		str(name, true)
	}
	if v, _ := str("specversion", true); v != "1.0" {
		t.Errorf("specversion %q, want 1.0", v)
	}
	if v, _ := str("source", true); v != "" {
		if _, err := url.Parse(v); err != nil || strings.ContainsAny(v, " \t\n") {
			t.Errorf("source %q is not a URI-reference", v)
		}
	}
	str("subject", false)
	if v, ok := str("time", false); ok {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil || !rfc3339.MatchString(v) {
			t.Errorf("time %q is not an RFC 3339 timestamp", v)
		}
	}
	if v, ok := str("datacontenttype", false); ok && !regexp.MustCompile(`^[a-z]+/[a-z0-9.+-]+(;.*)?$`).MatchString(v) {
		t.Errorf("datacontenttype %q is not a media type", v)
	}
	if v, ok := str("dataschema", false); ok {
		if u, err := url.Parse(v); err != nil || !u.IsAbs() {
			t.Errorf("dataschema %q is not an absolute URI", v)
		}
	}
	_, data := ev["data"]
	if _, b64 := ev["data_base64"]; data && b64 {
		t.Errorf("both data and data_base64: %s", raw)
	}
	known := map[string]bool{"id": true, "source": true, "specversion": true, "type": true, "subject": true, "time": true,
		"datacontenttype": true, "dataschema": true, "data": true, "data_base64": true}
	for name, v := range ev {
		if known[name] {
			continue
		}
		var x any
		_ = json.Unmarshal(v, &x)
		switch x.(type) {
		case string, float64, bool:
		default:
			t.Errorf("extension %s is %s, not a string, number or boolean", name, v)
		}
		if !regexp.MustCompile(`^[a-z0-9]{1,20}$`).MatchString(name) {
			t.Errorf("attribute name %q is not lower-case letters and digits", name)
		}
	}
	return ev
}

// exported is one export's output lines, its stderr and its cursor.
type exported struct {
	lines  []string
	cursor string
	events int
}

var cursorLine = regexp.MustCompile(`(?m)^cursor (\S+) \((\d+) events\)\n\z`)

// export runs assay usage export with args on the database at dbURL.
func export(t *testing.T, dbURL string, args ...string) exported {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append([]string{"--database-url", dbURL, "--region", "us"}, args...)
	if err := usageExport(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("assay usage export %s: %v", strings.Join(args, " "), err)
	}
	m := cursorLine.FindStringSubmatch(errOut.String())
	if m == nil {
		t.Fatalf("stderr %q does not end with the cursor", errOut.String())
	}
	e := exported{cursor: m[1]}
	fmt.Sscan(m[2], &e.events)
	if s := strings.TrimSuffix(out.String(), "\n"); s != "" {
		e.lines = strings.Split(s, "\n")
	}
	if len(e.lines) != e.events && !slices.Contains(args, "cloudevents-batch") {
		t.Errorf("%d lines, stderr says %d events", len(e.lines), e.events)
	}
	return e
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// settled waits until the ledger's export order holds n rows: a
// transaction elsewhere on the server that writes may hold it back a
// moment, never for good.
func settled(t *testing.T, st *store.Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := 0
		if _, err := st.ExportLedger(t.Context(), store.LedgerExport{}, func(store.ExportedRow) error { got++; return nil }); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the export order holds %d rows after 30s, want %d", got, n)
		}
	}
}

// exportFixture is a migrated database with tenants acme and globex, a
// work of each, and a way to record ledger rows of them.
type exportFixture struct {
	st    *store.Store
	dbURL string
	works map[string]string
	now   time.Time
}

func newExportFixture(t *testing.T) *exportFixture {
	t.Helper()
	st, dbURL := storetest.Migrated(t, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok-acme-export"},
		store.TenantSeed{ID: "globex", HomeRegion: "us", Token: "tok-globex-export"})
	f := &exportFixture{st: st, dbURL: dbURL, works: map[string]string{}, now: time.Now().UTC().Truncate(time.Microsecond)}
	for _, tenant := range []string{"acme", "globex"} {
		w := &store.Work{ID: "w_export_" + tenant, TenantID: tenant, Region: "us", Contract: "code-review", SchemaVersion: "1",
			TaxonomyVersion: "1", SourceID: "shop/export#1", Revision: "r1", Lane: "interactive", Input: `{"diff":""}`,
			Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)}
		if _, _, err := st.InsertWork(t.Context(), w, func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		f.works[tenant] = w.ID
	}
	return f
}

// row is a call of tenant's work at at, with cached and reasoning units.
func (f *exportFixture) row(tenant string, at time.Time) store.LedgerRow {
	return store.LedgerRow{AttemptID: randomUUID(), TenantID: tenant, WorkID: f.works[tenant], Model: "gpt-4o-mini",
		Outcome: "ok", UpstreamAttempts: 1, InputUnits: 2048, CachedInputUnits: 1024, OutputUnits: 300, ReasoningUnits: 64,
		CostMicros: 437, LatencyMS: 20, OccurredAt: at}
}

// record records rows and waits until the export order holds total rows.
func (f *exportFixture) record(t *testing.T, total int, rows ...store.LedgerRow) {
	t.Helper()
	for _, r := range rows {
		if _, err := f.st.AppendLedger(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, f.st, total)
}

// checkExported holds each line to CloudEvents 1.0 and to the row it
// exports, and returns the events' ids.
func checkExported(t *testing.T, lines []string, rows []store.LedgerRow) []string {
	t.Helper()
	var ids []string
	for i, l := range lines {
		ev := checkCloudEvent(t, []byte(l))
		var e cloudEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
		if i >= len(rows) {
			continue
		}
		r := rows[i]
		want := modelCallData{Model: "gpt-4o-mini", Contract: "code-review", ContractVersion: "1", WorkID: r.WorkID, Outcome: r.Outcome,
			InputUnits: 2048, CachedInputUnits: r.CachedInputUnits, OutputUnits: 300, ReasoningUnits: r.ReasoningUnits,
			CostMicros: 437, Estimated: r.Estimated}
		if e.ID != r.AttemptID || e.Subject != r.TenantID || e.Source != "urn:assay:assay:us" || e.Type != "dev.assay.model.call" ||
			e.DataContentType != "application/json" || e.Time != r.OccurredAt.Format(time.RFC3339Nano) || e.Data != want {
			t.Errorf("event %d: %s\nwant the row %+v", i, l, r)
		}
		if string(ev["data"])[0] != '{' {
			t.Errorf("data is not a JSON object: %s", ev["data"])
		}
	}
	if len(ids) != len(rows) {
		t.Fatalf("%d events, want %d", len(ids), len(rows))
	}
	return ids
}

// The export writes each ledger row as a CloudEvent 1.0 an OpenMeter meter
// sums: the attempt id as its id, the tenant as its subject, the row's
// time, units, cached and reasoning units, cost and estimate in its data.
// Exported again it gives the same events; resumed at a cursor, exactly
// the events after it; as a batch, the same events in one JSON array.
func TestUsageExportCloudEvents(t *testing.T) {
	t.Setenv("ASSAY_INSTALLATION", "")
	f := newExportFixture(t)
	now := f.now
	estimate := f.row("globex", now)
	estimate.Outcome, estimate.CachedInputUnits, estimate.ReasoningUnits, estimate.Estimated = "timeout", 0, 0, true
	rows := []store.LedgerRow{f.row("acme", now), estimate, f.row("acme", now.Add(-48*time.Hour)), f.row("globex", now), f.row("acme", now)}
	f.record(t, len(rows), rows...)

	all := export(t, f.dbURL, "--format", "cloudevents")
	checkExported(t, all.lines, rows)
	// An export that reads to the end ends at the oldest transaction still
	// running on the server, which other transactions move on: a later
	// export's end is the same place or past it, never before it.
	if again := export(t, f.dbURL, "--format", "cloudevents"); !slices.Equal(again.lines, all.lines) || !notBefore(t, again.cursor, all.cursor) {
		t.Errorf("exported again: %d events ending at %s, want the same %d ending at %s or past it", again.events, again.cursor, all.events, all.cursor)
	}
	first := export(t, f.dbURL, "--format", "cloudevents", "--limit", "2")
	rest := export(t, f.dbURL, "--format", "cloudevents", "--after", first.cursor)
	if !slices.Equal(first.lines, all.lines[:2]) || !slices.Equal(rest.lines, all.lines[2:]) || !notBefore(t, rest.cursor, all.cursor) {
		t.Errorf("two events, then resumed at %s: %d and %d events, want the first two and exactly the other %d",
			first.cursor, first.events, rest.events, len(rows)-2)
	}
	batch := export(t, f.dbURL, "--format", "cloudevents-batch")
	var arr []json.RawMessage
	if err := json.Unmarshal([]byte(strings.Join(batch.lines, "\n")), &arr); err != nil || len(arr) != len(rows) {
		t.Fatalf("the batch is not a JSON array of %d events (%v)", len(rows), err)
	}
	for i, ev := range arr {
		if checkCloudEvent(t, ev); string(ev) != all.lines[i] {
			t.Errorf("batch event %d %s, want %s", i, ev, all.lines[i])
		}
	}
	narrow := export(t, f.dbURL, "--format", "cloudevents", "--tenant", "acme", "--since", "24h")
	if !slices.Equal(narrow.lines, []string{all.lines[0], all.lines[4]}) {
		t.Errorf("acme's last day: %q", narrow.lines)
	}

	if none := export(t, f.dbURL, "--format", "cloudevents", "--after", all.cursor); none.events != 0 {
		t.Errorf("resumed at the end: %d events, want none", none.events)
	}
	later := []store.LedgerRow{f.row("globex", now), f.row("acme", now)}
	f.record(t, len(rows)+len(later), later...)
	next := export(t, f.dbURL, "--format", "cloudevents", "--after", all.cursor)
	if got := checkExported(t, next.lines, later); !slices.Equal(got, []string{later[0].AttemptID, later[1].AttemptID}) {
		t.Errorf("resumed at %s after two more calls: %v, want exactly the two", all.cursor, got)
	}
}

// notBefore says whether cursor a is the same place in the export's order
// as b or past it.
func notBefore(t *testing.T, a, b string) bool {
	t.Helper()
	ca, err := store.ParseLedgerCursor(a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := store.ParseLedgerCursor(b)
	if err != nil {
		t.Fatal(err)
	}
	return ca.Xact > cb.Xact || ca.Xact == cb.Xact && ca.AttemptID >= cb.AttemptID
}

// A format, a cursor or a limit export cannot use is refused as a setting.
func TestUsageExportRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "json"}, `--format "json"`},
		{[]string{"--format", "cloudevents", "--after", "812.nope"}, "--after"},
		{[]string{"--format", "cloudevents", "--limit", "-1"}, "--limit -1"},
		{[]string{"--format", "cloudevents", "--since", "yesterday"}, "--since"},
	} {
		args := append([]string{"--database-url", "postgres://postgres@127.0.0.1:1/none", "--region", "us"}, c.args...)
		err := usageExport(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{})
		if _, ok := err.(cli.ConfigError); !ok || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a setting error naming %s", c.args, err, c.want)
		}
	}
	err := usageExport(context.Background(), []string{"--format", "cloudevents", "--database-url", "postgres://x@127.0.0.1:1/n", "--region", ""},
		&bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "ASSAY_REGION") {
		t.Errorf("no region and no source: %v", err)
	}
}
