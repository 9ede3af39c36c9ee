package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

const replayUsage = `usage: assay replay dump|revalidate|redrive [selection] [flags]

Replays the cell's retained streams through an ordered consumer that is
deleted when the read ends. NATS is $ASSAY_NATS_URL; revalidate and redrive
also read the cell's Postgres.

  dump        JSON lines of the selected messages: stream, subject, sequence,
              time, headers (trace context included: traceparent names the
              work's trace) and payload, with the work and attempt they
              name; a result's lease token is masked as a digest. Payloads
              carry ids, outcomes and reasons, never inputs or answers
  revalidate  run today's gate (or --contracts DIR's) on the answers of the
              selected work, kept in the cell's database, and report which
              verdicts would change and why; writes nothing
  redrive     queue the selected work that ended in a failed outcome again
              through the normal fences; a dry run unless --confirm N repeats
              the count the dry run gave; each ending is redriven once

selection (all optional, combined):
  --stream WORK,RESULT,ATTEMPT,OUTCOME
                                streams to read (default: dump all; revalidate
                                ATTEMPT and RESULT; redrive WORK)
  --tenant T                    one tenant's subjects
  --lane interactive|batch      one lane's announcements (WORK only)
  --since T --until T           a time window: RFC 3339, a date, or a
                                duration back from now (90m, 24h)
  --seq FROM-TO                 a sequence range of one --stream
  --work ID[,ID...]             messages of these work items (w_ and 24 hex
                                digits; one with no message selected is an
                                error)

flags:
  --json                        print JSON (dump always prints JSON lines)
  --region R --database-url URL the cell ($ASSAY_REGION, $ASSAY_DATABASE_URL)
  revalidate: --contracts DIR   a contracts.json and its schemas to check
                                against instead of today's
  redrive:    --confirm N       write: N is the count the dry run printed; in one
                                transaction, and nothing at all if the
                                selection no longer holds N (exit 1)
              --deadline D      the redriven work's new deadline (default 10m)
              --again           also redrive work redriven before (a new ending)

A tenant moved between cells of the region (assay tenant move) is followed:
its events stay in the streams of the cell that made them, so --tenant T
reads each cell's streams for the time it served T, as the region's
placement map records T's moves (in $ASSAY_PLACEMENT_NATS_URL's account when
set, else the cell's own): the first cell's from the beginning until T's
first move, the next one's from then until the next move, the last one's
until now. Each stream's messages come in time order across the cells, and
each message (and each stream read) names the cell it was read from
("cell"). Another cell's streams are read through this cell's NATS
connection (the cells of a region may share an account) unless
ASSAY_NATS_URL_<CELL> (US_2 for cell us-2) names its server. --seq cannot
select such a tenant: sequences are per stream of one cell. A tenant that
never moved, and a replay without --tenant, read this cell's streams alone.

A progress bar is drawn on stderr when it is a terminal.
`

// replayFlags are the flags of a replay mode: the selection's, and the
// modes' own.
type replayFlags struct {
	mode          string
	sel           selectFlags
	asJSON, again bool
	contracts     string
	confirm       int
	deadline      time.Duration
	region, dbURL string
	set           map[string]bool // the flags given
}

// parseReplayFlags reads mode's flags; it takes no positional argument.
func parseReplayFlags(mode string, args []string) (*replayFlags, error) {
	f := &replayFlags{mode: mode, set: map[string]bool{}}
	fs := flag.NewFlagSet("assay replay "+mode, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.sel.streams, "stream", "", "streams to read")
	fs.StringVar(&f.sel.tenant, "tenant", "", "one tenant")
	fs.StringVar(&f.sel.lane, "lane", "", "one lane")
	fs.StringVar(&f.sel.since, "since", "", "from")
	fs.StringVar(&f.sel.until, "until", "", "until")
	fs.StringVar(&f.sel.seq, "seq", "", "sequence range")
	fs.StringVar(&f.sel.works, "work", "", "work ids")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.StringVar(&f.contracts, "contracts", "", "contracts directory (revalidate)")
	fs.IntVar(&f.confirm, "confirm", -1, "redrive: the dry run's count")
	fs.Bool("dry-run", true, "redrive: the default; --confirm N writes")
	fs.DurationVar(&f.deadline, "deadline", 10*time.Minute, "redrive: new deadline from now")
	fs.BoolVar(&f.again, "again", false, "redrive: also work redriven before")
	fs.StringVar(&f.region, "region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	pos, err := parseArgs(fs, args, replayUsage)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", pos[0], replayUsage)}
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	return f, nil
}

// validate checks that each mode's own flags are given to it alone, and
// their values.
func (f *replayFlags) validate() error {
	switch {
	case f.mode != "revalidate" && f.contracts != "":
		return cli.ConfigError{Err: fmt.Errorf("--contracts is for revalidate")}
	case f.mode != "redrive" && (f.set["confirm"] || f.again):
		return cli.ConfigError{Err: fmt.Errorf("--confirm and --again are for redrive")}
	case f.set["confirm"] && f.confirm < 0:
		return cli.ConfigError{Err: fmt.Errorf("--confirm: %d is not a count: give the count the dry run printed (0 or more)", f.confirm)}
	case f.deadline <= 0:
		return cli.ConfigError{Err: fmt.Errorf("--deadline: %s is not a positive duration", f.deadline)}
	}
	return nil
}

// replayCmd runs `assay replay …`.
func replayCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "dump" && args[0] != "revalidate" && args[0] != "redrive") {
		return tool.UnknownSub("replay", args)
	}
	mode := args[0]
	f, err := parseReplayFlags(mode, args[1:])
	if err != nil {
		return err
	}
	defKinds := map[string][]string{"dump": event.Kinds, "revalidate": {event.KindAttempt, event.KindResult}, "redrive": {event.KindWork}}[mode]
	sel, err := f.sel.selection(time.Now(), defKinds)
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	if err := f.validate(); err != nil {
		return err
	}
	db := f.dbURL
	if mode == "dump" {
		db = ""
	}
	cfg, err := loadCell("assay replay", f.region, db)
	if err != nil {
		return err
	}
	var reg *contract.Registry
	if mode == "revalidate" {
		if reg, err = loadContracts(f.contracts); err != nil {
			return err
		}
	}
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := replayer{names: cfg.Names(), stdout: stdout, json: f.asJSON, bar: newProgress()}
	if sel.tenant != "" {
		if r.follow, err = followTenant(ctx, cfg, js, sel.tenant); err != nil {
			return err
		}
		defer r.follow.close()
		if r.follow != nil && sel.fromSeq != 0 {
			return cli.ConfigError{Err: fmt.Errorf("--seq: tenant %s moved between cells (%s): sequences are per stream of one cell; select by --since and --until",
				sel.tenant, r.follow.cellsSaid())}
		}
		if r.follow != nil {
			fmt.Fprintf(os.Stderr, "tenant %s moved between cells: reading %s\n", sel.tenant, r.follow.cellsSaid())
		}
	}
	if mode == "dump" {
		return r.dump(ctx, js, sel)
	}
	st, err := openStore(ctx, f.dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	ids, reads, err := r.workIDs(ctx, js, sel)
	if err != nil {
		return err
	}
	if mode == "revalidate" {
		return r.revalidate(ctx, st, reg, ids, reads)
	}
	return r.redrive(ctx, st, outbox.Announce(ctx, cfg.Names()), ids, reads,
		store.RedriveOptions{Deadline: time.Now().Add(f.deadline), Again: f.again}, f.confirm)
}

// loadContracts loads today's contracts, or dir's.
func loadContracts(dir string) (*contract.Registry, error) {
	if dir == "" {
		return contract.Load()
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, cli.ConfigError{Err: fmt.Errorf("--contracts: %s is not a directory", dir)}
	}
	reg, err := contract.LoadFS(os.DirFS(dir))
	if err != nil {
		return nil, cli.ConfigError{Err: fmt.Errorf("--contracts %s: %w", dir, err)}
	}
	return reg, nil
}

type replayer struct {
	names event.Names
	// follow, when set, reads the tenant selected across the cells that
	// served it.
	follow *following
	stdout io.Writer
	json   bool
	bar    *progress
}

// dump prints the selected messages as JSON lines and, on stderr, what
// each stream held and gave.
func (r replayer) dump(ctx context.Context, js jetstream.JetStream, sel selection) error {
	enc := json.NewEncoder(r.stdout)
	enc.SetEscapeHTML(false)
	seen := map[string]bool{}
	reads, err := readTenant(ctx, r.follow, js, r.names, sel, r.bar, func(m ReplayMsg) error {
		seen[m.WorkID] = true
		return enc.Encode(m)
	})
	for _, s := range reads {
		fmt.Fprintf(os.Stderr, "%s: %d message(s) dumped of %d read; the stream holds %d\n", s.name(), s.Selected, s.Read, s.Held)
	}
	if err != nil {
		return err
	}
	return sel.unseen(seen)
}

// workIDs are the work items the selected messages name, in the order
// they first appear.
func (r replayer) workIDs(ctx context.Context, js jetstream.JetStream, sel selection) ([]string, []streamRead, error) {
	seen := map[string]bool{}
	var ids []string
	reads, err := readTenant(ctx, r.follow, js, r.names, sel, r.bar, func(m ReplayMsg) error {
		if m.WorkID != "" && !seen[m.WorkID] {
			seen[m.WorkID] = true
			ids = append(ids, m.WorkID)
		}
		return nil
	})
	if err == nil {
		err = sel.unseen(seen)
	}
	return ids, reads, err
}

// Verdict is one historical answer checked again.
type Verdict struct {
	WorkID    string `json:"workId"`
	AttemptID string `json:"attemptId"`
	Number    int    `json:"number"`
	// Was is the attempt's outcome (ok: passed the gate; invalid_output:
	// refused) and WasReason its reason; Now is pass or fail today and
	// NowReason the failure, by gate code and location.
	Was       string `json:"was"`
	WasReason string `json:"wasReason,omitempty"`
	Now       string `json:"now"`
	NowReason string `json:"nowReason,omitempty"`
	Changed   bool   `json:"changed"`
}

// Revalidation is what assay replay revalidate reports.
type Revalidation struct {
	Streams []streamRead `json:"streams"`
	Works   int          `json:"works"`
	Checked int          `json:"checked"`
	Changed []Verdict    `json:"changed"`
	// Skipped names answers that could not be checked again, and why.
	Skipped []string `json:"skipped"`
}

// revalidate runs the gate on the kept answers of the selected work.
func (r replayer) revalidate(ctx context.Context, st *store.Store, reg *contract.Registry, ids []string, reads []streamRead) error {
	rep := Revalidation{Streams: reads, Changed: []Verdict{}, Skipped: []string{}}
	for _, id := range ids {
		w, err := st.GetWork(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: not in the cell's database", id))
			continue
		}
		if err != nil {
			return err
		}
		rep.Works++
		c, known := reg.Get(w.Contract)
		if !known {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: contract %q is not among the contracts checked against", id, w.Contract))
			continue
		}
		answers, err := st.AttemptAnswers(ctx, id)
		if err != nil {
			return err
		}
		for _, a := range answers {
			v, skip := recheck(c, w, a)
			if skip != "" {
				if a.Outcome == outcome.AttemptOK || a.Outcome == outcome.AttemptInvalidOutput {
					rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s attempt %d: %s", id, a.Number, skip))
				}
				continue
			}
			rep.Checked++
			if v.Changed {
				rep.Changed = append(rep.Changed, v)
			}
		}
	}
	if r.json {
		return json.NewEncoder(r.stdout).Encode(rep)
	}
	for _, s := range reads {
		fmt.Fprintf(r.stdout, "%s: %d message(s) read, %d selected\n", s.name(), s.Read, s.Selected)
	}
	fmt.Fprintf(r.stdout, "%d answer(s) of %d work item(s) checked again: %d verdict(s) would change\n",
		rep.Checked, rep.Works, len(rep.Changed))
	if len(rep.Changed) > 0 {
		tw := tabwriter.NewWriter(r.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WORK\tATTEMPT\tWAS\tNOW\tWHY")
		for _, v := range rep.Changed {
			why := v.NowReason
			if v.Now == "pass" {
				why = "passes today; was refused: " + v.WasReason
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", v.WorkID, v.Number, v.Was, v.Now, why)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(r.stdout, "skipped %s\n", s)
	}
	return nil
}

// recheck runs the gate on one kept answer as the classifier did: against
// what the work was asked (its id, schema and taxonomy versions, digest)
// and its input. skip says why it cannot.
func recheck(c *contract.Contract, w *store.Work, a store.AttemptAnswer) (v Verdict, skip string) {
	switch {
	case a.Outcome != outcome.AttemptOK && a.Outcome != outcome.AttemptInvalidOutput:
		return v, "its outcome " + a.Outcome + " is no gate verdict"
	case a.Raw == nil:
		return v, "no answer kept (purged, or refused by the database)"
	case w.Input == "":
		return v, "the work's input was purged"
	}
	v = Verdict{WorkID: w.ID, AttemptID: a.ID, Number: a.Number, Was: a.Outcome, WasReason: a.Reason, Now: "pass"}
	_, fail := gate.Check(c, a.Raw, gate.ExpectFor(c, gate.Seen{WorkID: w.ID, SchemaVersion: w.SchemaVersion,
		TaxonomyVersion: w.TaxonomyVersion, Digest: w.Digest}, w.Digest, []byte(w.Input)))
	if fail != nil {
		v.Now, v.NowReason = "fail", fail.Code+": "+fail.Detail
	}
	v.Changed = (v.Now == "pass") != (a.Outcome == outcome.AttemptOK)
	return v, ""
}

// Redriven is one work item a redrive queued, or would.
type Redriven struct {
	WorkID   string `json:"workId"`
	Was      string `json:"was"`
	Dispatch int    `json:"dispatch"`
}

// Redrive is what assay replay redrive reports.
type Redrive struct {
	Streams  []streamRead `json:"streams"`
	DryRun   bool         `json:"dryRun"`
	Selected int          `json:"selected"`
	Redriven []Redriven   `json:"redriven"`
	// Refused counts the selected work left alone, by why.
	Refused map[string][]string `json:"refused"`
}

// redrive queues the selected work again, or says what it would. With
// confirm (0 or more), the store writes in one transaction only when the
// selection still holds exactly confirm work items to redrive.
func (r replayer) redrive(ctx context.Context, st *store.Store, announce func(*store.Work) ([]store.OutboxMsg, error),
	ids []string, reads []streamRead, o store.RedriveOptions, confirm int) error {
	o.DryRun = confirm < 0
	done, err := st.RedriveSet(ctx, ids, o, confirm, announce)
	if errors.Is(err, store.ErrSelectionChanged) {
		return fmt.Errorf("--confirm %d: %w; nothing was written: run the dry run again", confirm, err)
	}
	if err != nil {
		return err
	}
	rep := Redrive{Streams: reads, DryRun: o.DryRun, Selected: len(ids), Redriven: []Redriven{}, Refused: map[string][]string{}}
	for _, d := range done {
		if d.Err != nil {
			why := refusal(d.Err, d.Was)
			rep.Refused[why] = append(rep.Refused[why], d.ID)
			continue
		}
		rep.Redriven = append(rep.Redriven, Redriven{WorkID: d.ID, Was: d.Was, Dispatch: d.Work.Dispatch})
	}
	if r.json {
		return json.NewEncoder(r.stdout).Encode(rep)
	}
	for _, s := range reads {
		fmt.Fprintf(r.stdout, "%s: %d message(s) read, %d selected\n", s.name(), s.Read, s.Selected)
	}
	verb := "redriven"
	if rep.DryRun {
		verb = "would be redriven"
	}
	for _, w := range rep.Redriven {
		fmt.Fprintf(r.stdout, "%s %s (was %s, dispatch %d)\n", verb, w.WorkID, w.Was, w.Dispatch)
	}
	for why, ids := range rep.Refused {
		fmt.Fprintf(r.stdout, "left alone, %s: %d (%s)\n", why, len(ids), strings.Join(ids, ", "))
	}
	fmt.Fprintf(r.stdout, "%d of %d selected work item(s) %s\n", len(rep.Redriven), rep.Selected, verb)
	if rep.DryRun && len(rep.Redriven) > 0 {
		fmt.Fprintf(r.stdout, "a dry run: run it again with --confirm %d to redrive them\n", len(rep.Redriven))
	}
	return nil
}

// refusal says why a redrive left a work item alone, "" when it did not.
func refusal(err error, state string) string {
	switch {
	case errors.Is(err, store.ErrNotRedrivable):
		return "in state " + state
	case errors.Is(err, store.ErrRedriven):
		return "redriven before"
	case errors.Is(err, store.ErrSuperseded):
		return "a later revision replaced it"
	case errors.Is(err, store.ErrNoInput):
		return "its input was purged"
	case errors.Is(err, store.ErrNotFound):
		return "not in the cell's database"
	}
	return ""
}
