package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
)

const workUsage = `usage: assay work rerun ID [--deadline D] [--region R --database-url URL]
       assay work rest ID --cost-cap MICROS [--deadline D] [--region R --database-url URL]
       assay work show ID [--json] [--no-messages] [--answers] [--region R --database-url URL]
       assay work list [--state S,S] [--tenant T] [--lane L] [--since T] [--until T] [--limit N] [--after CURSOR] [--json]
       assay work submit [FILE|-] [--watch] [--url URL] [--token-file FILE]
       assay work get ID [--url URL] [--token-file FILE]
       assay work watch ID [--give-up-after D] [--url URL] [--token-file FILE]

  rerun ID      queue work that admission dropped again, with a new deadline
                (default 10m); the cell's ingress announces it
  rest ID       review the rest of a partial review (one its cost cap, its
                tenant's budget or its deadline stopped) as new work of the
                same revision under its own --cost-cap: the parts already
                published are not reviewed or paid for again, and the rest
                gets a check run and comments of its own
  show ID       the whole story of one work item: its row, trace, every attempt
                with its answer's size and digest, its ledger rows, result,
                outbox rows, redrives, publications (target, check run and
                comment ids, tries, last error, next try), the decisions they
                record, and its messages in WORK, RESULT, ATTEMPT and OUTCOME
                with sequences (NATS: $ASSAY_NATS_URL). --answers adds each
                answer's first 160 bytes: the model's raw text, which may quote
                the input (a credential in a diff, personal data); keep that
                output in the cell
  list          work in the order it was created, filtered: --state one or more
                states (queued,running or schema_rejected,retry_exhausted);
                --since and --until a time or a duration back from now
                (created at or after --since, before --until); --after
                continues a listing
` + workAPIUsage

// workCmd runs `assay work …` against the cell in ASSAY_DATABASE_URL.
func workCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "show" {
		return workShow(ctx, args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "list" && !tokenAtHand(args[1:]) {
		return workList(ctx, args[1:], stdout)
	}
	if len(args) > 0 && slices.Contains([]string{"submit", "get", "watch", "list"}, args[0]) {
		return workAPI(ctx, args[0], args[1:], stdout)
	}
	if len(args) == 0 || (args[0] != "rerun" && args[0] != "rest") {
		return tool.UnknownSub("work", args)
	}
	verb := args[0]
	fs := flag.NewFlagSet("assay work "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	deadline := fs.Duration("deadline", 10*time.Minute, "how long the work may take from now")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	costCap := fs.Int64("cost-cap", 0, "the rest's cap on its calls' estimated cost, micro-dollars")
	var pos []string
	for rest := args[1:]; len(rest) > 0; {
		if err := fs.Parse(rest); err != nil {
			return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, workUsage)}
		}
		if rest = fs.Args(); len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if len(pos) != 1 {
		return cli.ConfigError{Err: fmt.Errorf("work %s takes one work id, got %d\n%s", verb, len(pos), workUsage)}
	}
	if *deadline <= 0 {
		return cli.ConfigError{Err: fmt.Errorf("--deadline: %s is not a positive duration", *deadline)}
	}
	if verb == "rest" && *costCap <= 0 {
		return cli.ConfigError{Err: fmt.Errorf("work rest needs --cost-cap, a positive number of micro-dollars (the partial review's check run gives what the parts left are estimated at)")}
	}
	if verb == "rerun" && *costCap != 0 {
		return cli.ConfigError{Err: fmt.Errorf("--cost-cap is for work rest")}
	}
	cfg, err := config.Load("assay work", []string{"--region", *region, "--database-url", *dbURL}, regionsOnly, config.Need{})
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	if verb == "rest" {
		return workRest(ctx, st, pos[0], *costCap, time.Now().Add(*deadline), cfg.Names(), *region, stdout)
	}
	w, err := st.Rerun(ctx, pos[0], time.Now().Add(*deadline), outbox.Announce(ctx, cfg.Names()))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no work %q in region %s's database", pos[0], *region)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "work %s queued again (dispatch %d, deadline %s)\n", w.ID, w.Dispatch, w.DeadlineAt.UTC().Format(time.RFC3339))
	return nil
}

// workRest queues the rest of a partial review: new work of the same
// revision under its own cost cap, which reviews the parts the review
// left and publishes them as a check run and comments of its own.
func workRest(ctx context.Context, st *store.Store, id string, costCap int64, deadline time.Time, names event.Names,
	region string, stdout io.Writer) error {
	w, created, err := st.ReviewRest(ctx, id, costCap, deadline, api.WorkID, outbox.Announce(ctx, names))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no work %q in region %s's database", id, region)
	}
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(stdout, "the rest of %s is already queued as work %s (%s); nothing new was made\n", id, w.ID, w.State)
		return nil
	}
	fmt.Fprintf(stdout, "the rest of %s queued as work %s (revision %s, cost cap %d micro-dollars, deadline %s)\n",
		id, w.ID, w.Revision, costCap, w.DeadlineAt.UTC().Format(time.RFC3339))
	return nil
}
