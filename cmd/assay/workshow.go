package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/services/ingress"
)

// WorkRow is a work row as the operator sees it; the input itself stays
// in the database (its size and digest are shown).
type WorkRow struct {
	ID              string    `json:"workId"`
	TenantID        string    `json:"tenantId"`
	Region          string    `json:"region"`
	Contract        string    `json:"contract"`
	SchemaVersion   string    `json:"schemaVersion"`
	TaxonomyVersion string    `json:"taxonomyVersion"`
	SourceID        string    `json:"sourceId"`
	Revision        string    `json:"revision"`
	Lane            string    `json:"lane"`
	State           string    `json:"state"`
	Reason          string    `json:"reason,omitempty"`
	Attempts        int       `json:"attempts"`
	Repairs         int       `json:"repairs"`
	Dispatch        int       `json:"dispatch"`
	InputBytes      int       `json:"inputBytes"`
	Digest          string    `json:"digest"`
	Traceparent     string    `json:"traceparent,omitempty"`
	DeadlineAt      time.Time `json:"deadlineAt"`
	CreatedAt       time.Time `json:"createdAt"`
	UpdatedAt       time.Time `json:"updatedAt"`
}

func workRow(w *store.Work) WorkRow {
	return WorkRow{ID: w.ID, TenantID: w.TenantID, Region: w.Region, Contract: w.Contract, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, SourceID: w.SourceID, Revision: w.Revision, Lane: w.Lane, State: w.State,
		Reason: w.Reason, Attempts: w.Attempts, Repairs: w.Repairs, Dispatch: w.Dispatch, InputBytes: len(w.Input),
		Digest: w.Digest, Traceparent: w.Traceparent, DeadlineAt: w.DeadlineAt, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
}

// AttemptStory is one attempt with an excerpt of its kept answer.
type AttemptStory struct {
	ID           string     `json:"attemptId"`
	Number       int        `json:"number"`
	Outcome      string     `json:"outcome"`
	Reason       string     `json:"reason,omitempty"`
	StartedAt    time.Time  `json:"startedAt"`
	FinishedAt   *time.Time `json:"finishedAt,omitempty"`
	AnswerBytes  int        `json:"answerBytes"`
	AnswerSHA256 string     `json:"answerSha256,omitempty"`
	// Excerpt is the answer's first bytes, only when --answers asks:
	// a model's answer may quote its input (a credential in a diff,
	// personal data), and this output leaves the database.
	Excerpt string `json:"excerpt,omitempty"`
}

// Decision is one thing the cell decided about the work, as its records
// show it.
type Decision struct {
	At     time.Time `json:"at"`
	What   string    `json:"what"`
	Reason string    `json:"reason,omitempty"`
	// From names the record it is read from.
	From string `json:"from"`
}

// WorkStory is what assay work show prints.
type WorkStory struct {
	Work      WorkRow           `json:"work"`
	TraceID   string            `json:"traceId,omitempty"`
	Attempts  []AttemptStory    `json:"attempts"`
	Ledger    []store.LedgerRow `json:"ledger"`
	Result    *store.Result     `json:"result,omitempty"`
	Outbox    []store.OutboxRow `json:"outbox"`
	Redrives  []store.Redrive   `json:"redrives"`
	Decisions []Decision        `json:"decisions"`
	Messages  []ReplayMsg       `json:"messages"`
	// MessagesError says why the streams could not be read.
	MessagesError string `json:"messagesError,omitempty"`

	// Publications are where its outcome went, one per target.
	Publications []ingress.PublicationView `json:"publications"`
}

// excerptBytes is how much of an answer work show prints.
const excerptBytes = 160

// excerpt is the start of an answer, printable: bytes that are not UTF-8
// and control characters are escaped.
func excerpt(raw []byte) string {
	cut := raw[:min(len(raw), excerptBytes)]
	var b strings.Builder
	for len(cut) > 0 {
		r, n := utf8.DecodeRune(cut)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, cut[0])
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
		cut = cut[n:]
	}
	if len(raw) > excerptBytes {
		b.WriteString("…")
	}
	return b.String()
}

// traceID is the trace id of a W3C traceparent, "" when there is none.
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[1]
}

// readStory reads everything the cell records about one work item, with
// an excerpt of each answer when withAnswers is set.
func readStory(ctx context.Context, st *store.Store, id string, withAnswers bool) (*WorkStory, error) {
	w, err := st.GetWork(ctx, id)
	if err != nil {
		return nil, err
	}
	s := &WorkStory{Work: workRow(w), TraceID: traceID(w.Traceparent), Attempts: []AttemptStory{}, Messages: []ReplayMsg{}}
	answers, err := st.AttemptAnswers(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, a := range answers {
		as := AttemptStory{ID: a.ID, Number: a.Number, Outcome: a.Outcome, Reason: a.Reason, StartedAt: a.StartedAt,
			FinishedAt: a.FinishedAt, AnswerBytes: len(a.Raw)}
		if a.Raw != nil {
			sum := sha256.Sum256(a.Raw)
			as.AnswerSHA256 = hex.EncodeToString(sum[:])
			if withAnswers {
				as.Excerpt = excerpt(a.Raw)
			}
		}
		s.Attempts = append(s.Attempts, as)
	}
	if s.Ledger, err = st.LedgerOf(ctx, id); err != nil {
		return nil, err
	}
	if w.State == outcome.Accepted {
		if s.Result, err = st.GetResult(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	if s.Outbox, err = st.OutboxOf(ctx, id); err != nil {
		return nil, err
	}
	if s.Redrives, err = st.RedrivesOf(ctx, id); err != nil {
		return nil, err
	}
	pubs, err := st.PublicationsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	s.Publications = ingress.PublicationViews(pubs)
	s.Decisions = decisions(w, s)
	return s, nil
}

// decisions puts the cell's records of one work item in time order: each
// row is the trace of a decision made when it was written.
func decisions(w *store.Work, s *WorkStory) []Decision {
	ds := []Decision{{At: w.CreatedAt, What: "admitted", Reason: "work row written by ingress", From: "work.created_at"}}
	number := map[string]int{}
	for _, a := range s.Attempts {
		number[a.ID] = a.Number
		ds = append(ds, Decision{At: a.StartedAt, What: fmt.Sprintf("claimed attempt %d", a.Number), Reason: "lease taken", From: "attempts.started_at"})
		if a.FinishedAt != nil {
			ds = append(ds, Decision{At: *a.FinishedAt, What: fmt.Sprintf("attempt %d: %s", a.Number, a.Outcome), Reason: a.Reason, From: "attempts.outcome"})
		}
	}
	for _, o := range s.Outbox {
		what := "event " + o.Stream + " " + o.MsgID
		if o.Stream == event.KindWork {
			what = "announced " + o.MsgID
			if strings.HasPrefix(o.MsgID, "cancel.") {
				what = "cancel sent " + o.MsgID
			}
		}
		switch {
		case o.PublishedAt != nil:
			ds = append(ds, Decision{At: *o.PublishedAt, What: what, Reason: "published to " + o.Subject, From: "outbox.published_at"})
		case o.SetAside:
			ds = append(ds, Decision{At: o.CreatedAt, What: what, Reason: "set aside: could not be published", From: "outbox.set_aside_at"})
		default:
			ds = append(ds, Decision{At: o.CreatedAt, What: what, Reason: "written, not yet published", From: "outbox.created_at"})
		}
	}
	for _, l := range s.Ledger {
		reason := fmt.Sprintf("%d in, %d out, %d micro-dollars", l.InputUnits, l.OutputUnits, l.CostMicros)
		if l.Estimated {
			reason += ", estimated (no usage came back)"
		}
		ds = append(ds, Decision{At: l.OccurredAt, What: fmt.Sprintf("charged attempt %d (%s)", number[l.AttemptID], l.Outcome), Reason: reason, From: "ledger"})
	}
	if s.Result != nil {
		ds = append(ds, Decision{At: s.Result.CreatedAt, What: "committed", Reason: fmt.Sprintf("attempt %d accepted, %d finding(s)",
			number[s.Result.AttemptID], s.Result.Findings), From: "results"})
	}
	for _, r := range s.Redrives {
		ds = append(ds, Decision{At: r.EndedAt, What: "ended " + r.EndedState, Reason: r.EndedReason, From: "redrives.ended_state"})
		ds = append(ds, Decision{At: r.RedrivenAt, What: "redriven", Reason: fmt.Sprintf("its %s ending of %s queued again as dispatch %d",
			r.EndedState, r.EndedAt.UTC().Format(time.RFC3339), r.Dispatch), From: "redrives"})
	}
	if w.Terminal() && w.State != outcome.Accepted {
		ds = append(ds, Decision{At: w.UpdatedAt, What: "ended " + w.State, Reason: w.Reason, From: "work.state"})
	}
	slices.SortStableFunc(ds, func(a, b Decision) int { return a.At.Compare(b.At) })
	return ds
}

// workShow runs `assay work show ID`.
func workShow(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay work show", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	noMsgs := fs.Bool("no-messages", false, "do not read the streams")
	answers := fs.Bool("answers", false, "print the first bytes of each answer (they may quote the input)")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	pos, err := parseArgs(fs, args, workUsage)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return configError{fmt.Errorf("work show takes one work id, got %d\n%s", len(pos), workUsage)}
	}
	cfg, err := loadCell("assay work", *region, *dbURL)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	s, err := readStory(ctx, st, pos[0], *answers)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no work %q in region %s's database", pos[0], cfg.Region)
	}
	if err != nil {
		return err
	}
	if !*noMsgs {
		if err := storyMessages(ctx, cfg, s); err != nil {
			s.MessagesError = err.Error()
		}
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(s); err != nil {
			return err
		}
	} else if err := printStory(stdout, s); err != nil {
		return err
	}
	if s.MessagesError != "" {
		return fmt.Errorf("the streams could not be read (--no-messages skips them): %s", s.MessagesError)
	}
	return nil
}

// storyMessages finds the work's messages in WORK, RESULT, ATTEMPT and
// OUTCOME: those on the tenant's subjects, from just before the work was
// created, whose payload names the work.
func storyMessages(ctx context.Context, cfg config.Config, s *WorkStory) error {
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	sel := selection{kinds: event.Kinds, tenant: s.Work.TenantID, since: s.Work.CreatedAt.Add(-5 * time.Second),
		until: storyEnd(s), works: map[string]bool{s.Work.ID: true}}
	_, err = readSelection(ctx, js, cfg.Names(), sel, nil, func(m ReplayMsg) error {
		s.Messages = append(s.Messages, m)
		return nil
	})
	return err
}

// storyEnd is when the work's last message can have been stored: a little
// after its last outbox row was published and its row last changed; zero
// (the stream's end) while a row waits to be published.
func storyEnd(s *WorkStory) time.Time {
	end := s.Work.UpdatedAt
	for _, o := range s.Outbox {
		if o.PublishedAt == nil {
			return time.Time{}
		}
		if o.PublishedAt.After(end) {
			end = *o.PublishedAt
		}
	}
	return end.Add(time.Minute)
}

func printStory(w io.Writer, s *WorkStory) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	r := s.Work
	fmt.Fprintf(tw, "work %s\n", r.ID)
	fmt.Fprintf(tw, "  state\t%s\n", r.State)
	if r.Reason != "" {
		fmt.Fprintf(tw, "  reason\t%s\n", r.Reason)
	}
	fmt.Fprintf(tw, "  tenant\t%s (region %s, lane %s)\n", r.TenantID, r.Region, r.Lane)
	fmt.Fprintf(tw, "  contract\t%s (schema %s, taxonomy %s)\n", r.Contract, r.SchemaVersion, r.TaxonomyVersion)
	fmt.Fprintf(tw, "  source\t%s revision %s\n", r.SourceID, r.Revision)
	fmt.Fprintf(tw, "  input\t%d bytes, digest %s\n", r.InputBytes, r.Digest)
	fmt.Fprintf(tw, "  counts\t%d attempt(s), %d repair(s), dispatch %d\n", r.Attempts, r.Repairs, r.Dispatch)
	fmt.Fprintf(tw, "  times\tcreated %s, updated %s, deadline %s\n", rfc(r.CreatedAt), rfc(r.UpdatedAt), rfc(r.DeadlineAt))
	fmt.Fprintf(tw, "  trace\t%s\n", cmp.Or(s.TraceID, "- (no traceparent came with the request)"))
	fmt.Fprintln(tw, "\nattempts")
	if len(s.Attempts) == 0 {
		fmt.Fprintln(tw, "  none")
	}
	for _, a := range s.Attempts {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", a.Number, a.ID, a.Outcome, a.Reason)
		if a.AnswerBytes > 0 {
			fmt.Fprintf(tw, "  \tanswer\t%d bytes sha256:%s\t%s\n", a.AnswerBytes, a.AnswerSHA256[:16], cmp.Or(a.Excerpt, "(its text: --answers)"))
		}
	}
	fmt.Fprintln(tw, "\nledger")
	if len(s.Ledger) == 0 {
		fmt.Fprintln(tw, "  none")
	}
	for _, l := range s.Ledger {
		est := ""
		if l.Estimated {
			est = " (estimated)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d in / %d out\t%d µ$%s\t%d ms\n", l.AttemptID, l.Model, l.Outcome, l.InputUnits,
			l.OutputUnits, l.CostMicros, est, l.LatencyMS)
	}
	if s.Result != nil {
		fmt.Fprintf(tw, "\nresult\n  %s\tattempt %s\t%d finding(s)\t%s\n", s.Result.SchemaVersion, s.Result.AttemptID, s.Result.Findings, rfc(s.Result.CreatedAt))
	}
	fmt.Fprintln(tw, "\npublications")
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printPublications(w, s.Publications); err != nil {
		return err
	}
	fmt.Fprintln(tw, "\ndecisions")
	for _, d := range s.Decisions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t[%s]\n", rfc(d.At), d.What, d.Reason, d.From)
	}
	fmt.Fprintln(tw, "\nmessages")
	switch {
	case s.MessagesError != "":
		fmt.Fprintf(tw, "  not read: %s\n", s.MessagesError)
	case len(s.Messages) == 0:
		fmt.Fprintln(tw, "  none retained")
	}
	for _, m := range s.Messages {
		id := ""
		if v := m.Headers["Nats-Msg-Id"]; len(v) > 0 {
			id = v[0]
		}
		fmt.Fprintf(tw, "  %s\tseq %d\t%s\t%s\tmsg-id %s\t%s\n", m.Stream, m.Sequence, rfc(m.Time), m.Subject, orDash(id), m.Outcome)
	}
	return tw.Flush()
}

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// workList runs `assay work list`.
func workList(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay work list", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	state := fs.String("state", "", "states, comma separated")
	tenant := fs.String("tenant", "", "one tenant")
	lane := fs.String("lane", "", "one lane")
	since := fs.String("since", "", "created since: a time or a duration back from now")
	until := fs.String("until", "", "created before: a time or a duration back from now")
	limit := fs.Int("limit", 100, "rows, at most 1000")
	after := fs.String("after", "", "continue after this cursor (printed when more rows follow)")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	pos, err := parseArgs(fs, args, workUsage)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return configError{fmt.Errorf("unexpected argument %q\n%s", pos[0], workUsage)}
	}
	f := store.WorkFilter{Tenant: *tenant, Lane: *lane, Limit: *limit}
	for _, s := range strings.Split(*state, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(outcome.WorkStates, s) {
			return configError{fmt.Errorf("--state: %q is not one of %s", s, strings.Join(outcome.WorkStates, ", "))}
		}
		f.States = append(f.States, s)
	}
	switch {
	case f.Tenant != "" && !event.ValidToken(f.Tenant):
		return configError{fmt.Errorf("--tenant: %q is not a tenant id", f.Tenant)}
	case f.Lane != "" && !event.ValidLane(f.Lane):
		return configError{fmt.Errorf("--lane: %q is not a lane (%s)", f.Lane, strings.Join(event.Lanes, ", "))}
	case f.Limit < 1 || f.Limit > 1000:
		return configError{fmt.Errorf("--limit: %d is not from 1 to 1000", f.Limit)}
	}
	now := time.Now()
	if f.Since, err = parseWhen(*since, now); err != nil {
		return configError{fmt.Errorf("--since: %w", err)}
	}
	if f.Until, err = parseWhen(*until, now); err != nil {
		return configError{fmt.Errorf("--until: %w", err)}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return configError{fmt.Errorf("--until %s is not after --since %s", *until, *since)}
	}
	if *after != "" {
		if f.AfterCreated, f.AfterID, err = store.ParseWorkCursor(*after); err != nil {
			return configError{fmt.Errorf("--after: %w", err)}
		}
	}
	if _, err := loadCell("assay work", *region, *dbURL); err != nil {
		return err
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	ws, err := st.ListWork(ctx, f)
	if err != nil {
		return err
	}
	next := ""
	if len(ws) == f.Limit {
		next = store.WorkCursor(ws[len(ws)-1])
	}
	if *asJSON {
		rows := make([]WorkRow, 0, len(ws))
		for _, w := range ws {
			rows = append(rows, workRow(w))
		}
		return json.NewEncoder(stdout).Encode(struct {
			Items []WorkRow `json:"items"`
			Next  string    `json:"next,omitempty"`
		}{rows, next})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORK\tSTATE\tTENANT\tLANE\tCONTRACT\tATTEMPTS\tCREATED\tREASON")
	for _, w := range ws {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", w.ID, w.State, w.TenantID, w.Lane, w.Contract, w.Attempts,
			w.CreatedAt.UTC().Format(time.RFC3339), w.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(stdout, "more: --after %s\n", next)
	}
	return nil
}
