package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
)

const publishUsage = `usage: assay publish list [--since T] [--json] [--region R --database-url URL]
       assay publish retry --work ID | --since T [--confirm N] [--deadline D] [--region R --database-url URL]
       assay publish abandon --work ID --reason TEXT [--region R --database-url URL]

  list    the failed publications: past their deadline, or refused for good by
          their target, with the reason and the last error
  retry   send failed publications again: each is put back pending, at once,
          with a fresh deadline (--deadline, default $ASSAY_PUBLISH_DEADLINE
          or 24h), and the cell's publisher makes it once. --work ID retries
          that work item's; --since T (a time, or a duration back from now)
          every publication failed since then, a dry run that prints the count
          unless --confirm N repeats it
  abandon give a work item's failed publications up for good (their target is
          gone, a deleted repository): they are recorded skipped with the reason
`

// publishCmd runs `assay publish …` against the cell in ASSAY_DATABASE_URL.
func publishCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "retry" && args[0] != "abandon") {
		return cli.ConfigError{Err: errors.New(publishUsage)}
	}
	verb := args[0]
	fs := flag.NewFlagSet("assay publish "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	work := fs.String("work", "", "one work item")
	since := fs.String("since", "", "failed since")
	confirm := fs.Int("confirm", -1, "the dry run's count")
	reason := fs.String("reason", "", "abandon: why")
	deadline := fs.String("deadline", cmp.Or(os.Getenv("ASSAY_PUBLISH_DEADLINE"), "24h"), "the fresh deadline")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	pos, err := parseArgs(fs, args[1:], publishUsage)
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(*deadline)
	switch {
	case len(pos) > 0:
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", pos[0], publishUsage)}
	case err != nil || d < time.Minute:
		return cli.ConfigError{Err: fmt.Errorf("--deadline: %q is not a duration of a minute or more", *deadline)}
	case verb == "retry" && (*work == "") == (*since == ""):
		return cli.ConfigError{Err: fmt.Errorf("retry takes --work ID or --since T\n%s", publishUsage)}
	case verb == "list" && (*work != "" || *confirm >= 0):
		return cli.ConfigError{Err: fmt.Errorf("list takes --since and --json\n%s", publishUsage)}
	case *work != "" && *confirm >= 0:
		return cli.ConfigError{Err: fmt.Errorf("--confirm is for --since: --work names the one item to retry")}
	case verb == "abandon" && (*work == "" || *reason == "" || *since != ""):
		return cli.ConfigError{Err: fmt.Errorf("abandon takes --work ID and --reason TEXT\n%s", publishUsage)}
	case verb != "abandon" && *reason != "":
		return cli.ConfigError{Err: fmt.Errorf("--reason is for abandon\n%s", publishUsage)}
	}
	from, err := parseWhen(*since, time.Now())
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--since: %w", err)}
	}
	cfg, err := loadCell("assay publish", *region, *dbURL)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	if verb == "list" {
		failed, err := st.FailedPublications(ctx, "", from, 10000)
		if err != nil {
			return err
		}
		return printFailed(stdout, failed, *asJSON)
	}
	if verb == "abandon" {
		gone, err := st.AbandonPublications(ctx, *work, "abandoned by an operator: "+*reason)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d failed publication(s) of work %s abandoned\n", len(gone), *work)
		return nil
	}
	if *work != "" {
		return retryWork(ctx, st, stdout, cfg.Region, *work, d)
	}
	return retrySince(ctx, st, stdout, from, *confirm, d)
}

// retryWork sends one work item's failed publications again.
func retryWork(ctx context.Context, st *store.Store, stdout io.Writer, region, id string, d time.Duration) error {
	back, err := st.RetryPublications(ctx, id, time.Time{}, d)
	if err != nil {
		return err
	}
	if len(back) == 0 {
		pubs, err := st.PublicationsOf(ctx, id)
		if err != nil {
			return err
		}
		if len(pubs) == 0 {
			return fmt.Errorf("no publication of work %q in region %s's database", id, region)
		}
		fmt.Fprintf(stdout, "work %s has no failed publication; nothing sent:\n", id)
		return printPublications(stdout, story.PublicationViews(pubs))
	}
	for _, p := range back {
		fmt.Fprintf(stdout, "work %s: %s publication of %s pending again; the publisher sends it at once, deadline %s\n",
			p.WorkID, p.Target, p.Outcome, rfc(p.DeadlineAt))
	}
	return nil
}

// retrySince sends every publication failed since from again, once confirm
// repeats how many there are.
func retrySince(ctx context.Context, st *store.Store, stdout io.Writer, from time.Time, confirm int, d time.Duration) error {
	failed, err := st.FailedPublications(ctx, "", from, 10000)
	if err != nil {
		return err
	}
	if confirm < 0 {
		if err := printFailed(stdout, failed, false); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "dry run: %d failed publication(s) since %s; send them again with --confirm %d\n", len(failed), rfc(from), len(failed))
		return nil
	}
	if confirm != len(failed) {
		return fmt.Errorf("--confirm %d: %d publication(s) failed since %s now; run the dry run again", confirm, len(failed), rfc(from))
	}
	back, err := st.RetryPublications(ctx, "", from, d)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d publication(s) pending again; the publisher sends each at once, deadline %s from now\n", len(back), d)
	return nil
}

func printFailed(w io.Writer, ps []*store.Publication, asJSON bool) error {
	type failed struct {
		WorkID   string `json:"workId"`
		TenantID string `json:"tenantId"`
		api.PublicationView
		FailedAt time.Time `json:"failedAt"`
	}
	views := story.PublicationViews(ps)
	out := make([]failed, len(ps))
	for i, p := range ps {
		out[i] = failed{WorkID: p.WorkID, TenantID: p.TenantID, PublicationView: views[i], FailedAt: p.UpdatedAt.UTC()}
	}
	if asJSON {
		return json.NewEncoder(w).Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED\tWORK ID\tTENANT\tTARGET\tOUTCOME\tTRIES\tREASON")
	for _, f := range out {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", rfc(f.FailedAt), f.WorkID, f.TenantID, f.Target, f.Outcome, f.Tries, f.Reason)
	}
	return tw.Flush()
}

// printPublications prints a work item's publications, one per target:
// its state, the remote ids made, its tries and last error, and when it is
// tried next or was made.
func printPublications(w io.Writer, ps []api.PublicationView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(ps) == 0 {
		fmt.Fprintln(tw, "  none recorded")
	}
	for _, p := range ps {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d tries", p.Target, p.State, p.Outcome, p.Tries)
		if p.CheckRunID != 0 {
			fmt.Fprintf(tw, "\tcheck run %d", p.CheckRunID)
		}
		if len(p.CommentIDs) > 0 {
			keys := slices.Sorted(maps.Keys(p.CommentIDs))
			ids := make([]string, len(keys))
			for i, k := range keys {
				ids[i] = fmt.Sprintf("%s:%d", k, p.CommentIDs[k])
			}
			fmt.Fprintf(tw, "\tcomments %s", strings.Join(ids, ","))
		}
		if p.RerunCommentID != 0 {
			fmt.Fprintf(tw, "\trerun comment %d", p.RerunCommentID)
		}
		switch {
		case p.PublishedAt != nil:
			fmt.Fprintf(tw, "\tpublished %s", rfc(*p.PublishedAt))
		case p.NextTryAt != nil:
			fmt.Fprintf(tw, "\tnext try %s, deadline %s", rfc(*p.NextTryAt), rfc(*p.DeadlineAt))
		}
		if p.Reason != "" {
			fmt.Fprintf(tw, "\t%s", p.Reason)
		}
		if p.LastError != "" && p.State != "published" {
			fmt.Fprintf(tw, "\tlast error: %s", p.LastError)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
