package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/store"
	"assay.dev/pkg/usage"
)

// usageUsage is assay usage's help.
const usageUsage = `usage: assay usage reconcile [--database-url URL] [--region R] [--provider-stats URL] [--since T] [--json]
       assay usage show --tenant ID [--database-url URL] [--since T] [--until T] [--json]
       assay usage export --format cloudevents|cloudevents-batch [--database-url URL] [--region R]
                          [--tenant ID] [--since T] [--after CURSOR] [--limit N] [--source URI]

reconcile: check attempts against results and the ledger; with
--provider-stats (the simulated provider's address, or its /sim/stats URL)
also ledger rows against provider calls per tenant. Prints each check
(--json: one JSON object); exits 1 on a difference.

show: a tenant's calls, units and cost from the ledger, in total, by
outcome and by model — input units with those read from the provider's
prompt cache, output units with those spent on reasoning, and the part
that is estimated (--json: the object GET /v1/usage answers).

export: the ledger as CloudEvents 1.0 (JSON), one event per attempt, id the
attempt id, subject the tenant, type dev.assay.model.call: --format
cloudevents writes one event a line (JSON lines), cloudevents-batch one
JSON array (application/cloudevents-batch+json). Prints "cursor C (N
events)" to stderr at the end; --after C resumes after the last event.
  --tenant ID    that tenant's calls alone
  --after C      resume after the cursor an earlier export printed
  --limit N      at most N events (default: every one there is)
  --source URI   the events' source (default urn:assay:INSTALLATION:REGION,
                 from --region and $ASSAY_INSTALLATION)

  --since T   only ledger rows that occurred (reconcile: work created) at or
              after T: an RFC 3339 time or a duration back from now (24h);
              default: all time
  --until T   show: only ledger rows before T; default: now
`

// usageCmd is assay usage: reconcile, show or export.
func usageCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return tool.UnknownSub("usage", nil)
	}
	switch args[0] {
	case "show":
		return usageShow(ctx, args[1:], stdout)
	case "export":
		return usageExport(ctx, args[1:], stdout, stderr)
	}
	return usageReconcile(ctx, args[1:], stdout)
}

// usageReconcile is `assay usage reconcile`: it checks the cell's attempts
// against its results and ledger, and optionally the ledger against the
// provider's own count of calls, printing one line per check. It returns an
// error when any check finds a difference.
//
//	--database-url URL    the cell's Postgres (default $ASSAY_DATABASE_URL)
//	--region REGION       the cell; when set, work of another region is a difference (default $ASSAY_REGION)
//	--provider-stats URL  the simulated provider's GET /sim/stats; compares calls per tenant
//	--since TIME          only work created (ledger rows occurred) at or after TIME, RFC 3339 or a duration ago ("24h"); default all time
//	--json                one JSON object: the scope and every check
func usageReconcile(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay usage reconcile", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "the cell's region ($ASSAY_REGION)")
	statsURL := fs.String("provider-stats", "", "the simulated provider's address, base URL or /sim/stats URL")
	sinceFlag := fs.String("since", "", "RFC 3339 time or duration ago; default: everything")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: err}
	}
	if fs.NArg() > 0 {
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *dbURL == "" {
		return cli.ConfigError{Err: config.Missing("ASSAY_DATABASE_URL")}
	}
	since, err := parseWhen(*sinceFlag, time.Now())
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--since: %w", err)}
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()

	checks, err := st.Reconcile(ctx, since)
	if err != nil {
		return err
	}
	if *region != "" {
		c, err := st.RegionCheck(ctx, *region, since)
		if err != nil {
			return err
		}
		checks = append(checks, c)
	}
	if *statsURL != "" {
		c, err := providerCheck(ctx, st, *statsURL, since)
		if err != nil {
			return err
		}
		checks = append(checks, c)
	}

	scope := "all time"
	if !since.IsZero() {
		scope = "since " + since.UTC().Format(time.RFC3339)
	}
	var failed []string
	for _, c := range checks {
		if !c.OK() {
			failed = append(failed, c.Name)
		}
	}
	if *asJSON {
		err = printChecksJSON(stdout, cmpOr(*region, "cell"), scope, checks)
	} else {
		printChecks(stdout, cmpOr(*region, "cell"), scope, checks)
	}
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d checks found differences: %s", len(failed), len(checks), strings.Join(failed, ", "))
	}
	return nil
}

// checkLine is one check as --json prints it.
type checkLine struct {
	Name      string   `json:"name"`
	OK        bool     `json:"ok"`
	Checked   int64    `json:"checked"`
	Unit      string   `json:"unit"`
	Differ    int64    `json:"differ"`
	What      string   `json:"what"`
	Offenders []string `json:"offenders"`
}

func printChecksJSON(w io.Writer, cell, scope string, checks []store.Check) error {
	out := struct {
		Cell   string      `json:"cell"`
		Scope  string      `json:"scope"`
		OK     bool        `json:"ok"`
		Checks []checkLine `json:"checks"`
	}{Cell: cell, Scope: scope, OK: true, Checks: []checkLine{}}
	for _, c := range checks {
		out.OK = out.OK && c.OK()
		out.Checks = append(out.Checks, checkLine{Name: c.Name, OK: c.OK(), Checked: c.Checked, Unit: c.Unit, Differ: c.Differ,
			What: c.What, Offenders: append([]string{}, c.Offenders...)})
	}
	return json.NewEncoder(w).Encode(out)
}

func printChecks(w io.Writer, cell, scope string, checks []store.Check) {
	fmt.Fprintf(w, "reconcile %s, %s\n", cell, scope)
	for _, c := range checks {
		status := "OK  "
		if !c.OK() {
			status = "DIFF"
		}
		fmt.Fprintf(w, "%s  %-24s %d %s, %d differ  (%s)\n", status, c.Name, c.Checked, c.Unit, c.Differ, c.What)
		if len(c.Offenders) > 0 {
			more := ""
			if n := c.Differ - int64(len(c.Offenders)); n > 0 {
				more = fmt.Sprintf(" and %d more", n)
			}
			fmt.Fprintf(w, "      %s%s\n", strings.Join(c.Offenders, " "), more)
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// providerCheck compares the ledger's rows per tenant with the calls the
// provider counted per tenant. The provider counts since it started or its
// stats were reset, so --since should match that moment.
// statsEndpoint is the provider's stats URL from its address or base URL
// (http://127.0.0.1:8090, …/v1) or the full /sim/stats URL.
func statsEndpoint(u string) string {
	u = strings.TrimRight(u, "/")
	if strings.HasSuffix(u, "/sim/stats") {
		return u
	}
	return strings.TrimSuffix(u, "/v1") + "/sim/stats"
}

func providerCheck(ctx context.Context, st *store.Store, url string, since time.Time) (store.Check, error) {
	c := store.Check{Name: "ledger_provider_calls", What: "ledger rows per tenant equal the provider's calls per tenant", Unit: "tenants"}
	url = statsEndpoint(url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return c, cli.ConfigError{Err: fmt.Errorf("--provider-stats: %w", err)}
	}
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		return c, fmt.Errorf("provider stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("provider stats: %s answered HTTP %d", url, resp.StatusCode)
	}
	var stats providerStats
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&stats); err != nil {
		return c, fmt.Errorf("provider stats: %w", err)
	}
	rows, err := st.LedgerCountByTenantSince(ctx, since)
	if err != nil {
		return c, err
	}
	tenants := map[string]bool{}
	for t := range rows {
		tenants[t] = true
	}
	for t := range stats.Tenants {
		tenants[t] = true
	}
	names := make([]string, 0, len(tenants))
	for t := range tenants {
		names = append(names, t)
	}
	slices.Sort(names)
	c.Checked = int64(len(names))
	for _, t := range names {
		if calls := stats.Tenants[t].Calls; calls != rows[t] {
			c.Differ++
			if len(c.Offenders) < store.MaxOffenders {
				c.Offenders = append(c.Offenders, fmt.Sprintf("%s(provider=%d,ledger=%d)", t, calls, rows[t]))
			}
		}
	}
	return c, nil
}

// providerStats is the part of a provider's counts (the simulated
// provider's GET /sim/stats) that reconciling reads: each tenant's calls.
type providerStats struct {
	Tenants map[string]struct {
		Calls int64 `json:"calls"`
	} `json:"tenants"`
}

// usageShow is `assay usage show`: a tenant's usage from the cell's
// ledger, as GET /v1/usage reports it.
func usageShow(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay usage show", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	tenant := fs.String("tenant", "", "the tenant")
	sinceFlag := fs.String("since", "", "RFC 3339 time or duration ago; default: everything")
	untilFlag := fs.String("until", "", "RFC 3339 time or duration ago; default: now")
	asJSON := fs.Bool("json", false, "print the JSON object GET /v1/usage answers")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: err}
	}
	switch {
	case fs.NArg() > 0:
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	case *tenant == "":
		return cli.ConfigError{Err: errors.New("--tenant is required")}
	}
	now := time.Now()
	since, err := parseWhen(*sinceFlag, now)
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("--since: %w", err)}
	}
	until := now
	if *untilFlag != "" {
		if until, err = parseWhen(*untilFlag, now); err != nil {
			return cli.ConfigError{Err: fmt.Errorf("--until: %w", err)}
		}
	}
	if !since.Before(until) {
		return cli.ConfigError{Err: fmt.Errorf("--until %s is not after --since %s", cmpOr(*untilFlag, "now"), cmpOr(*sinceFlag, "the start"))}
	}
	st, err := openStore(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	rep, err := usage.Read(ctx, st, *tenant, since, until)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	printUsage(stdout, rep, *sinceFlag == "")
	return nil
}

// printUsage prints a usage report as a table: the total, then a line per
// outcome and per model.
func printUsage(w io.Writer, rep usage.Report, allTime bool) {
	scope := "since " + rep.From.Format(time.RFC3339)
	if allTime {
		scope = "all time"
	}
	fmt.Fprintf(w, "usage of %s, %s, until %s\n", rep.TenantID, scope, rep.To.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tcalls\tinput units\tcached\toutput units\treasoning\tcost $\testimated calls\testimated $\t")
	row := func(key string, l usage.Line) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.6f\t%d\t%.6f\t\n", key, l.Calls, l.InputUnits, l.CachedInputUnits,
			l.OutputUnits, l.ReasoningUnits, float64(l.CostMicros)/1e6, l.EstimatedCalls, float64(l.EstimatedCostMicros)/1e6)
	}
	row("total", usage.Line{Calls: rep.Calls, InputUnits: rep.InputUnits, CachedInputUnits: rep.CachedInputUnits,
		OutputUnits: rep.OutputUnits, ReasoningUnits: rep.ReasoningUnits, CostMicros: rep.CostMicros,
		EstimatedCalls: rep.EstimatedCalls, EstimatedCostMicros: rep.EstimatedCostMicros})
	for _, l := range rep.ByOutcome {
		row("outcome "+l.Outcome, l)
	}
	for _, l := range rep.ByModel {
		row("model "+l.Model, l)
	}
	_ = tw.Flush()
}
