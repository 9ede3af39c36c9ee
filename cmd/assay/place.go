package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
	"assay.dev/pkg/store"
)

// placeCmd runs `assay tenant place ID [--cell C]`, `assay tenant
// placement [--json]` and `assay tenant move ID --to C --to-database-url
// URL` against the region's placement map in NATS (and, to move, the two
// cells' databases).
func placeCmd(ctx context.Context, verb string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay tenant "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cellID := fs.String("cell", "", "the cell to place the tenant on (default: the region's least loaded)")
	to := fs.String("to", "", "move: the cell the tenant moves to")
	toDB := fs.String("to-database-url", "", "move: that cell's Postgres")
	settle := fs.Duration("settle", 2*time.Minute, "move: how long the cell it leaves keeps work it admitted and has not begun, before handing it over")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "move: the Postgres of the cell that serves the tenant now ($ASSAY_DATABASE_URL)")
	asJSON := fs.Bool("json", false, "print JSON")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "region ($ASSAY_REGION)")
	pos, err := parseArgs(fs, args, tenantUsage)
	if err != nil {
		return err
	}
	if want := tenantArgs[verb]; len(pos) != want {
		return cli.ConfigError{Err: fmt.Errorf("assay tenant %s takes %d argument(s), got %d\n%s", verb, want, len(pos), tenantUsage)}
	}
	cfg, err := natsOnlyCell(*region)
	if err != nil {
		return err
	}
	// The map is in the region's account when ASSAY_PLACEMENT_NATS_URL
	// names it (with a placer user), else in the cell's own.
	var nc *nats.Conn
	var js jetstream.JetStream
	if u := os.Getenv("ASSAY_PLACEMENT_NATS_URL"); u != "" {
		nc, js, err = placement.Connect(u, "assay-operator-"+cfg.Region)
	} else {
		nc, js, err = connectNATS(cfg)
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	kv, err := placement.Bucket(ctx, js, cfg.Names().PlacementBucket(cfg.Region), cfg.Streams.Replicas, cfg.Streams.Placement...)
	if err != nil {
		return err
	}
	snap, err := placement.Read(ctx, kv, cfg.Region)
	if err != nil {
		return err
	}
	if verb == "placement" {
		return printPlacement(stdout, snap, *asJSON)
	}
	if verb == "move" {
		return moveTenant(ctx, stdout, kv, snap, pos[0], *to, *dbURL, *toDB, *settle)
	}
	tenant, cell := pos[0], *cellID
	if !event.ValidToken(tenant) {
		return cli.ConfigError{Err: fmt.Errorf("%q is not a tenant id", tenant)}
	}
	if cell == "" {
		cell = snap.Choose()
	}
	if !event.ValidToken(cell) {
		return cli.ConfigError{Err: fmt.Errorf("--cell: %q is not a cell id (lower-case letters, digits, hyphens)", cell)}
	}
	was := snap.CellOf(tenant)
	if err := placement.Place(ctx, kv, tenant, cell); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s placed on cell %s of region %s (was %s)\n", tenant, cell, cfg.Region, was)
	if _, ok := snap.Cells[cell]; !ok && cell != cfg.Region {
		fmt.Fprintf(stdout, "cell %s has not registered where it answers (its ingress's ASSAY_CELL_URL): until it does, the region's other cells refuse the tenant's requests with 421 wrong_cell\n", cell)
	}
	return nil
}

func printPlacement(stdout io.Writer, snap *placement.Snapshot, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(stdout).Encode(snap)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tURL\tTENANTS")
	count := map[string]int{}
	for _, c := range snap.Tenants {
		count[c]++
	}
	ids := []string{}
	for id := range snap.Cells {
		ids = append(ids, id)
	}
	for id := range count {
		if _, ok := snap.Cells[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		url := snap.Cells[id].URL
		if url == "" {
			url = "(not registered)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\n", id, url, count[id])
	}
	fmt.Fprintf(tw, "(tenants not placed are served by cell %s)\n", snap.Region)
	if err := tw.Flush(); err != nil {
		return err
	}
	tenants := make([]string, 0, len(snap.Tenants))
	for t := range snap.Tenants {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nTENANT\tCELL")
	for _, t := range tenants {
		fmt.Fprintf(tw, "%s\t%s\n", t, snap.Tenants[t])
	}
	return tw.Flush()
}

// moveTenant moves tenant from the cell that serves it (its database
// fromDB) to cell to (toDB).
func moveTenant(ctx context.Context, stdout io.Writer, kv jetstream.KeyValue, snap *placement.Snapshot, tenant, to, fromDB, toDB string,
	settle time.Duration) error {
	switch {
	case !event.ValidToken(to):
		return cli.ConfigError{Err: fmt.Errorf("--to: %q is not a cell id (lower-case letters, digits, hyphens)", to)}
	case fromDB == "" || toDB == "":
		return cli.ConfigError{Err: fmt.Errorf("assay tenant move needs both cells' Postgres: ASSAY_DATABASE_URL (--database-url) of the cell that serves %s now, and --to-database-url of %s", tenant, to)}
	}
	from := snap.CellOf(tenant)
	if m, ok := snap.Moving[tenant]; ok && m.From != "" {
		from = m.From
	}
	src, err := openStore(ctx, fromDB)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := openStore(ctx, toDB)
	if err != nil {
		return fmt.Errorf("--to-database-url: %w", err)
	}
	defer dst.Close()
	fmt.Fprintf(stdout, "moving %s from cell %s to cell %s: its requests are answered throughout (held for the moment of the cut)\n", tenant, from, to)
	r, err := placement.Move(ctx, kv, snap.Region, src, dst, tenant, from, to, placement.MoveOptions{Settle: settle,
		Waiting: func(ws []store.Waiting) { printWaiting(stdout, tenant, ws) }})
	if err != nil {
		return err
	}
	if r.Resumed {
		fmt.Fprintf(stdout, "took up the tail of %s's move to %s\n", tenant, to)
	} else {
		fmt.Fprintf(stdout, "cut over %s to %s: requests held %s; copied %s\n", tenant, to, r.Held.Round(time.Millisecond), cli.RowCounts(r.Copied))
	}
	handed := ""
	if r.Handed {
		handed = " (work not begun by --settle was handed over)"
	}
	fmt.Fprintf(stdout, "moved %s to %s in %s: %d work item(s) finished in %s after the cut and copied over%s; removed from %s %s\n",
		tenant, to, r.Took.Round(time.Millisecond), r.Tail, from, handed, from, cli.RowCounts(r.Dropped))
	return nil
}

// printWaiting prints what a move's tail waits for: each work item, the
// cell that finishes it and why, the first ten named.
func printWaiting(w io.Writer, tenant string, ws []store.Waiting) {
	if len(ws) == 0 {
		return
	}
	fmt.Fprintf(w, "waiting for %d work item(s) of %s that %s finishes:\n", len(ws), tenant, ws[0].Cell)
	for i, x := range ws {
		if i == 10 {
			fmt.Fprintf(w, "  … and %d more\n", len(ws)-10)
			break
		}
		fmt.Fprintf(w, "  %s: %s\n", x.WorkID, x.Why)
	}
}
