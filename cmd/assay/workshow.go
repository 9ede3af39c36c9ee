package main

import (
	"cmp"
	"context"
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

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
)

// workShowFollows is what assay work show does for work of a tenant that
// moved between cells: the help of assay work says it.
const workShowFollows = `work show ID follows a tenant moved between cells of the region (assay
tenant move): when the work is not in this cell's database, or this cell
holds only a pointer to it (state elsewhere) while the cell that admitted
it finishes it, it is read from the database of another cell the tenant's
moves name (as the region's placement map records them; in
$ASSAY_PLACEMENT_NATS_URL's account when set, else the cell's own), the
most recent first, each named by ASSAY_DATABASE_URL_<CELL> (US_2 for cell
us-2); the first that holds it in another state than elsewhere answers,
and work show says which cell that is ("cell" in --json). Its messages
follow the tenant as assay replay --tenant does: each cell's streams for
the time it served the tenant, each message naming its cell.
`

func init() { helps["work"] += "\n" + workShowFollows }

// WorkStory is what assay work show prints: the cell's records of the
// work, and its messages in the streams.
type WorkStory struct {
	*story.Story
	// Cell is the cell whose database the work was read from, when not
	// this cell's: its tenant moved between cells.
	Cell string `json:"cell,omitempty"`
	// Elsewhere, when the work is only a pointer here (state elsewhere)
	// and no other cell's database could answer for it, says why.
	Elsewhere string      `json:"elsewhere,omitempty"`
	Messages  []ReplayMsg `json:"messages"`
	// MessagesError says why the streams could not be read.
	MessagesError string `json:"messagesError,omitempty"`
	// why says why the work was read from Cell, for a person.
	why string
}

// readStory reads the work's story, with an excerpt of each answer when
// withAnswers is set.
func readStory(ctx context.Context, st *store.Store, id string, withAnswers bool) (*WorkStory, error) {
	answers := story.AnswerNone
	if withAnswers {
		answers = story.AnswerFull
	}
	s, err := story.Read(ctx, st, id, answers)
	if err != nil {
		return nil, err
	}
	return &WorkStory{Story: s, Messages: []ReplayMsg{}}, nil
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
	pos, err := parseArgs(fs, args, workUsage+"\n"+workShowFollows)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.ConfigError{Err: fmt.Errorf("work show takes one work id, got %d\n%s", len(pos), workUsage+"\n"+workShowFollows)}
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
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err != nil || s.Work.State == outcome.Elsewhere {
		if s, err = storyElsewhere(ctx, cfg, pos[0], s, *answers); err != nil {
			return err
		}
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

// storyElsewhere reads work id from another cell of the region: the work
// is not in this cell's database, or here (s, nil when not) it only
// points to another cell. The cells tried are those the moves of its
// tenant name (of every tenant that moved, when the work is not here to
// say whose it is), the most recent first, each whose database
// ASSAY_DATABASE_URL_<CELL> names; the first that holds the work in
// another state than elsewhere answers. When none does, a pointer here is
// shown as it is, saying so.
func storyElsewhere(ctx context.Context, cfg config.Config, id string, s *WorkStory, withAnswers bool) (*WorkStory, error) {
	notHere := fmt.Errorf("no work %q in region %s's database", id, cfg.Region)
	tenant := ""
	if s != nil {
		tenant = s.Work.TenantID
	}
	cells, err := movedThrough(ctx, cfg, tenant)
	if err != nil {
		if s == nil {
			return nil, fmt.Errorf("%w, and the cells its tenant may have moved through could not be looked up: %w", notHere, err)
		}
		s.Elsewhere = fmt.Sprintf("the cells %s moved through could not be looked up: %v", tenant, err)
		return s, nil
	}
	var tried, unset []string
	for _, c := range cells {
		v := cellDatabaseVar(c)
		url := os.Getenv(cellDatabaseVar(c))
		if url == "" {
			unset = append(unset, v)
			continue
		}
		other, err := readStoryIn(ctx, c, url, id, withAnswers)
		if err != nil {
			return nil, err
		}
		if other == nil || other.Work.State == outcome.Elsewhere {
			tried = append(tried, c)
			continue
		}
		other.Cell = c
		if s == nil {
			other.why = fmt.Sprintf("not in this cell's (%s) database", cfg.Cell)
		} else {
			other.why = fmt.Sprintf("this cell (%s) holds only a pointer to it (state %s)", cfg.Cell, outcome.Elsewhere)
		}
		return other, nil
	}
	var more []string
	if len(tried) > 0 {
		more = append(more, "nor in the database of cell "+strings.Join(tried, ", "))
	}
	if len(unset) > 0 {
		more = append(more, "not looked for in the database of a cell the tenant moved through, as "+strings.Join(unset, ", ")+" is not set")
	}
	if s == nil {
		if len(more) > 0 {
			return nil, fmt.Errorf("%w; %s", notHere, strings.Join(more, "; "))
		}
		return nil, notHere
	}
	s.Elsewhere = cmp.Or(strings.Join(more, "; "), "the tenant's moves name no other cell")
	return s, nil
}

// movedThrough are the cells other than this one that tenant's moves name
// (every tenant's, when tenant is ""), the most recent first.
func movedThrough(ctx context.Context, cfg config.Config, tenant string) ([]string, error) {
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	kv, done, err := placementMap(ctx, cfg, js)
	if err != nil || kv == nil {
		return nil, err
	}
	defer done()
	var hops []placement.Hop
	if tenant != "" {
		if hops, err = placement.History(ctx, kv, tenant); err != nil {
			return nil, err
		}
	} else {
		all, err := placement.Histories(ctx, kv)
		if err != nil {
			return nil, err
		}
		for _, h := range all {
			hops = append(hops, h...)
		}
	}
	slices.SortStableFunc(hops, func(a, b placement.Hop) int { return b.At.Compare(a.At) })
	var cells []string
	for _, h := range hops {
		for _, c := range []string{h.To, h.From} {
			if c != cfg.Cell && event.ValidToken(c) && !slices.Contains(cells, c) {
				cells = append(cells, c)
			}
		}
	}
	return cells, nil
}

// readStoryIn reads work id's story from cell's database at url; nil when
// the work is not there.
func readStoryIn(ctx context.Context, cell, url, id string, withAnswers bool) (*WorkStory, error) {
	st, err := store.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("cell %s's database (%s): %w", cell, cellDatabaseVar(cell), config.RedactError(err, url))
	}
	defer st.Close()
	s, err := readStory(ctx, st, id, withAnswers)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cell %s's database (%s): %w", cell, cellDatabaseVar(cell), err)
	}
	return s, nil
}

// storyMessages finds the work's messages in WORK, RESULT, ATTEMPT and
// OUTCOME: those on the tenant's subjects, from just before the work was
// created, whose payload names the work. They follow the tenant across
// the cells that served it, as assay replay --tenant does; work read from
// another cell's database, of a tenant whose moves are not recorded, is
// looked for in that cell's streams.
func storyMessages(ctx context.Context, cfg config.Config, s *WorkStory) error {
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	follow, err := followTenant(ctx, cfg, js, s.Work.TenantID)
	if err != nil {
		return err
	}
	if follow == nil && s.Cell != "" {
		follow = &following{tenant: s.Work.TenantID, spans: []span{{cell: s.Cell}}, cells: newRegionCells(cfg, js)}
	}
	defer follow.close()
	sel := selection{kinds: event.Kinds, tenant: s.Work.TenantID, since: s.Work.CreatedAt.Add(-5 * time.Second),
		until: storyEnd(s), works: map[string]bool{s.Work.ID: true}}
	_, err = readTenant(ctx, follow, js, cfg.Names(), sel, nil, func(m ReplayMsg) error {
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

// printStory prints one work item's story, section by section, as work
// show does without --json.
func printStory(w io.Writer, s *WorkStory) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	printWorkRow(tw, s)
	printAttempts(tw, s)
	fmt.Fprintln(tw, "\npublications")
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printPublications(w, s.Publications); err != nil {
		return err
	}
	printReview(tw, s.Review)
	printAfter(tw, s)
	return tw.Flush()
}

// printWorkRow prints the work row: where it was read, its state and
// what it counts as, its tenant, contract, source, input and times.
func printWorkRow(tw io.Writer, s *WorkStory) {
	r := s.Work
	if s.Cell != "" {
		fmt.Fprintf(tw, "read from cell %s's database: %s\n", s.Cell, cmp.Or(s.why, "its tenant moved between cells"))
	}
	fmt.Fprintf(tw, "work %s\n", r.ID)
	fmt.Fprintf(tw, "  state\t%s\n", r.State)
	if s.Elsewhere != "" {
		fmt.Fprintf(tw, "  \tonly a pointer: another cell of the region finishes it, and it was not read there: %s\n", s.Elsewhere)
	}
	fmt.Fprintf(tw, "  counts as\t%s\n", countsAs(s))
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
}

// printAttempts prints the attempts, their ledger rows and the result.
func printAttempts(tw io.Writer, s *WorkStory) {
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
}

// printAfter prints what came after the outcome and around it: the
// operator's actions, the decision log and the retained messages.
func printAfter(tw io.Writer, s *WorkStory) {
	fmt.Fprintln(tw, "\nactions")
	if len(s.Actions) == 0 {
		fmt.Fprintln(tw, "  none")
	}
	for _, a := range s.Actions {
		fmt.Fprintf(tw, "  %s\t%s\tby %s\t%s\n", rfc(a.At), a.Action, a.Actor(), a.Note)
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
		stream := m.Stream
		if m.Cell != "" {
			stream += " (cell " + m.Cell + ")"
		}
		fmt.Fprintf(tw, "  %s\tseq %d\t%s\t%s\tmsg-id %s\t%s\n", stream, m.Sequence, rfc(m.Time), m.Subject, orDash(id), m.Outcome)
	}
}

func rfc(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// countsAs is the work's one state, as the work API and the views give
// it, with the resolution that decided it when a person published.
func countsAs(s *WorkStory) string {
	if v := s.Review; v != nil && (v.Published || v.State == store.ReviewOpen) {
		return s.View + " (review " + v.ReviewID + " " + cmp.Or(v.Resolution, "open") + ")"
	}
	return s.View
}

// printReview prints the work's review item: how it stands, or the
// verdict, who gave it (the actor the credential named) and when, and the
// answer a person published.
func printReview(tw *tabwriter.Writer, v *api.WorkReview) {
	if v == nil {
		return
	}
	fmt.Fprintf(tw, "\nreview\n  %s\t%s\t%s\n", v.ReviewID, v.Reason, v.State)
	if v.HeldBy != "" {
		fmt.Fprintf(tw, "  \theld by\t%s %s until %s\n", v.HeldByKind, v.HeldBy, rfc(*v.HeldUntil))
	}
	if v.ResolvedAt == nil {
		return
	}
	fmt.Fprintf(tw, "  \tverdict\t%s\n", v.Verdict)
	fmt.Fprintf(tw, "  \tresolved\t%s at %s\n", v.Resolution, rfc(*v.ResolvedAt))
	if v.Note != "" {
		fmt.Fprintf(tw, "  \tnote\t%s\n", v.Note)
	}
	if v.Output != nil {
		var out struct {
			Findings *[]json.RawMessage `json:"findings"`
		}
		what := "its answer"
		if json.Unmarshal(v.Output, &out) == nil && out.Findings != nil {
			what = fmt.Sprintf("%d finding(s)", len(*out.Findings))
		}
		fmt.Fprintf(tw, "  \tpublished\t%s, as the work's reviewed outcome (--json has the answer)\n", what)
	}
}

// workListFlags are the flags of `assay work list`.
type workListFlags struct {
	asJSON                                   bool
	state, tenant, lane, since, until, after string
	limit                                    int
	region, dbURL                            string
}

// parseWorkListFlags reads work list's flags; it takes no positional
// argument.
func parseWorkListFlags(args []string) (workListFlags, error) {
	var f workListFlags
	fs := flag.NewFlagSet("assay work list", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.StringVar(&f.state, "state", "", "states, comma separated")
	fs.StringVar(&f.tenant, "tenant", "", "one tenant")
	fs.StringVar(&f.lane, "lane", "", "one lane")
	fs.StringVar(&f.since, "since", "", "created since: a time or a duration back from now")
	fs.StringVar(&f.until, "until", "", "created before: a time or a duration back from now")
	fs.IntVar(&f.limit, "limit", 100, "rows, at most 1000")
	fs.StringVar(&f.after, "after", "", "continue after this cursor (printed when more rows follow)")
	fs.StringVar(&f.region, "region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	pos, err := parseArgs(fs, args, workUsage)
	if err != nil {
		return f, err
	}
	if len(pos) > 0 {
		return f, cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", pos[0], workUsage)}
	}
	return f, nil
}

// filter checks the flags and makes the store's filter of them.
func (fl workListFlags) filter() (store.WorkFilter, error) {
	f := store.WorkFilter{Tenant: fl.tenant, Lane: fl.lane, Limit: fl.limit}
	for _, s := range strings.Split(fl.state, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(outcome.WorkStates, s) {
			return f, cli.ConfigError{Err: fmt.Errorf("--state: %q is not one of %s", s, strings.Join(outcome.WorkStates, ", "))}
		}
		f.States = append(f.States, s)
	}
	switch {
	case f.Tenant != "" && !event.ValidToken(f.Tenant):
		return f, cli.ConfigError{Err: fmt.Errorf("--tenant: %q is not a tenant id", f.Tenant)}
	case f.Lane != "" && !event.ValidLane(f.Lane):
		return f, cli.ConfigError{Err: fmt.Errorf("--lane: %q is not a lane (%s)", f.Lane, strings.Join(event.Lanes, ", "))}
	case f.Limit < 1 || f.Limit > 1000:
		return f, cli.ConfigError{Err: fmt.Errorf("--limit: %d is not from 1 to 1000", f.Limit)}
	}
	now := time.Now()
	var err error
	if f.Since, err = parseWhen(fl.since, now); err != nil {
		return f, cli.ConfigError{Err: fmt.Errorf("--since: %w", err)}
	}
	if f.Until, err = parseWhen(fl.until, now); err != nil {
		return f, cli.ConfigError{Err: fmt.Errorf("--until: %w", err)}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return f, cli.ConfigError{Err: fmt.Errorf("--until %s is not after --since %s", fl.until, fl.since)}
	}
	if fl.after != "" {
		if f.AfterCreated, f.AfterID, err = store.ParseWorkCursor(fl.after); err != nil {
			return f, cli.ConfigError{Err: fmt.Errorf("--after: %w", err)}
		}
	}
	return f, nil
}

// workList runs `assay work list`.
func workList(ctx context.Context, args []string, stdout io.Writer) error {
	fl, err := parseWorkListFlags(args)
	if err != nil {
		return err
	}
	f, err := fl.filter()
	if err != nil {
		return err
	}
	if _, err := loadCell("assay work", fl.region, fl.dbURL); err != nil {
		return err
	}
	st, err := openStore(ctx, fl.dbURL)
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
	return printWorkList(stdout, ws, next, fl.asJSON)
}

// printWorkList prints ws, as JSON or a table, and the cursor that
// continues after them when more rows follow.
func printWorkList(stdout io.Writer, ws []*store.Work, next string, asJSON bool) error {
	if asJSON {
		rows := make([]story.WorkRow, 0, len(ws))
		for _, w := range ws {
			rows = append(rows, story.WorkRowOf(w))
		}
		return json.NewEncoder(stdout).Encode(struct {
			Items []story.WorkRow `json:"items"`
			Next  string          `json:"next,omitempty"`
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
