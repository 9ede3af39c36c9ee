package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/store"
)

const outboxUsage = `usage: assay outbox list [--json] [--region R --database-url URL]
       assay outbox retry ID... | --all [--region R --database-url URL]

  list     outbox rows set aside because they could not be published, with their error
  retry    put set-aside rows back in the queue (the relay tries them again)
`

// outboxCmd runs `assay outbox …` against the cell in ASSAY_DATABASE_URL.
func outboxCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "retry") {
		return tool.UnknownSub("outbox", args)
	}
	verb := args[0]
	fs := flag.NewFlagSet("assay outbox "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "retry every set-aside row")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	var pos []string
	for rest := args[1:]; len(rest) > 0; {
		if err := fs.Parse(rest); err != nil {
			return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, outboxUsage)}
		}
		if rest = fs.Args(); len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if _, err := config.Load("assay outbox", []string{"--region", *region, "--database-url", *dbURL}, regionsOnly, config.Need{}); err != nil {
		return cli.ConfigError{Err: err}
	}
	var ids []int64
	for _, p := range pos {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			return cli.ConfigError{Err: fmt.Errorf("outbox row id %q is not a positive whole number\n%s", p, outboxUsage)}
		}
		ids = append(ids, id)
	}
	switch {
	case verb == "list" && (len(ids) > 0 || *all):
		return cli.ConfigError{Err: errors.New(outboxUsage)}
	case verb == "retry" && (len(ids) > 0) == *all:
		return cli.ConfigError{Err: fmt.Errorf("retry takes row ids or --all\n%s", outboxUsage)}
	}
	st, err := store.Open(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("ASSAY_DATABASE_URL: %w", err)
	}
	defer st.Close()
	if verb == "retry" {
		n, err := st.RetrySetAside(ctx, ids)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d set-aside row(s) back in the queue; the relay publishes them on its next pass\n", n)
		return nil
	}
	rows, err := st.SetAsideRows(ctx, 1000)
	if err != nil {
		return err
	}
	if *asJSON {
		if rows == nil {
			rows = []store.SetAsideRow{}
		}
		return json.NewEncoder(stdout).Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no set-aside outbox rows in region %s\n", *region)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTREAM\tSUBJECT\tMSG ID\tBYTES\tTRIES\tSET ASIDE\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", r.ID, r.Stream, r.Subject, r.MsgID, r.Bytes, r.Tries,
			r.SetAside.UTC().Format(time.RFC3339), r.LastError)
	}
	return tw.Flush()
}
