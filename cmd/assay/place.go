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

	"assay.dev/pkg/event"
	"assay.dev/pkg/placement"
)

// placeCmd runs `assay tenant place ID [--cell C]` and `assay tenant
// placement [--json]` against the region's placement map in NATS.
func placeCmd(ctx context.Context, verb string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay tenant "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cellID := fs.String("cell", "", "the cell to place the tenant on (default: the region's least loaded)")
	asJSON := fs.Bool("json", false, "print JSON")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "region ($ASSAY_REGION)")
	pos, err := parseArgs(fs, args, tenantUsage)
	if err != nil {
		return err
	}
	if want := tenantArgs[verb]; len(pos) != want {
		return configError{fmt.Errorf("assay tenant %s takes %d argument(s), got %d\n%s", verb, want, len(pos), tenantUsage)}
	}
	cfg, err := natsOnlyCell(*region)
	if err != nil {
		return err
	}
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	kv, err := placement.Bucket(ctx, js, cfg.Names().PlacementBucket(cfg.Region), cfg.Streams.Replicas)
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
	tenant, cell := pos[0], *cellID
	if !event.ValidToken(tenant) {
		return configError{fmt.Errorf("%q is not a tenant id", tenant)}
	}
	if cell == "" {
		cell = snap.Choose()
	}
	if !event.ValidToken(cell) {
		return configError{fmt.Errorf("--cell: %q is not a cell id (lower-case letters, digits, hyphens)", cell)}
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
