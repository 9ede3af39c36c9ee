package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

const benchPartsUsage = `usage: assay-dev bench parts [--part-units N] [--cost-cap MICROS] [--part-concurrency N] [FILE.diff ...]
       assay-dev bench parts --model-latency D [--files 40] [--runs 3] [--part-units 1500] [--part-concurrency N]

Reviews the evaluation set and each unified diff FILE, one at a time, on a
cell of its own with the simulated provider, and prints per work item its
parts, model calls, ledger cost and time from created to its outcome.
With --model-latency the simulated provider answers each call after D, and
the bench reviews a one-file change (one part, one call) and then, --runs
times, a pull request of --files new files cut into parts (--part-units,
1500 unless given), and prints each review's time against the one part's,
as "N.Nx one part", with the cell's adaptive limit when it started (4 in a
fresh cell, growing as calls answer) and its calls and ledger rows.
ASSAY_DATABASE_URL names a Postgres to make the cell's database on (else a
throwaway one is started).`

// benchParts measures reviews in parts: what each work item cost in calls,
// money and time.
func benchParts(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay-dev bench parts", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	units := fs.Int("part-units", 0, "the part size in model units (default: the contract's; 1500 with --model-latency)")
	capMicros := fs.Int64("cost-cap", 0, "the work cost cap in micro-dollars (default: none)")
	concurrency := fs.Int("part-concurrency", 0, "calls one review in parts makes at once (default: the classifier's, 8)")
	latency := fs.Duration("model-latency", 0, "how long the simulated provider takes to answer each call")
	files := fs.Int("files", 40, "with --model-latency, the files of the pull request reviewed in parts")
	runs := fs.Int("runs", 3, "with --model-latency, how many times the pull request is reviewed")
	if err := fs.Parse(args); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, benchPartsUsage)}
	}
	if *latency < 0 || *files < 2 || *runs < 1 || *concurrency < 0 {
		return cli.ConfigError{Err: fmt.Errorf("--model-latency and --part-concurrency must not be negative, --files at least 2 and --runs at least 1\n%s", benchPartsUsage)}
	}
	items, err := partsItems(fs.Args())
	if err != nil {
		return err
	}
	if *latency > 0 && *units == 0 {
		*units = 1500
	}
	base := os.Getenv("ASSAY_DATABASE_URL")
	if base == "" {
		pg, err := devpg.Start(ctx, "")
		if err != nil {
			return fmt.Errorf("throwaway postgres (set ASSAY_DATABASE_URL to use a running server): %w", err)
		}
		defer func() { _ = pg.Stop() }()
		base = pg.URL("postgres")
	}
	cc := classifier.Config{PartUnits: *units, WorkCostCap: *capMicros, PartConcurrency: *concurrency}
	bed, err := startBenchBed(ctx, base, cell.Options{Classifier: cc, Log: benchLogger(io.Discard, 0, "")}, []string{"acme"},
		sim.Options{Latency: *latency})
	if err != nil {
		return err
	}
	defer bed.close()
	if *latency > 0 {
		return benchPartsSpeed(ctx, bed, stdout, speedRun{files: *files, runs: *runs, latency: *latency,
			concurrency: cmp.Or(*concurrency, classifier.DefaultPartConcurrency)})
	}
	tw := partsTable(stdout)
	for i, it := range items {
		if _, err := benchPartsItem(ctx, bed, tw, i, it); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// partsTable is bench parts' table, its header written.
func partsTable(w io.Writer) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "work\tdiff bytes\tparts\tcalls\tledger rows\tcost µ$\ttime\toutcome\treviewed")
	return tw
}

// speedRun is what bench parts --model-latency reviews.
type speedRun struct {
	files, runs, concurrency int
	latency                  time.Duration
}

// benchPartsSpeed reviews a one-file change, one part's review, then a
// pull request of r.files r.runs times: a fresh cell's adaptive limit
// starts at 4 and grows as the calls answer, so the first review runs
// under it and the later ones as a busy cell's would. It prints each
// review's time against the one part's.
func benchPartsSpeed(ctx context.Context, bed *benchBed, stdout io.Writer, r speedRun) error {
	tw := partsTable(stdout)
	one, err := benchPartsItem(ctx, bed, tw, 0, partsItem{"one file", benchPR(1)})
	if err != nil {
		return err
	}
	var lines []string
	for i := range r.runs {
		limit := bed.cell.Classifier.Limiter().Limit()
		pr, err := benchPartsItem(ctx, bed, tw, i+1, partsItem{fmt.Sprintf("%d files", r.files), benchPR(r.files)})
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("review %d, the cell's limit %d: %d files in %s parts in %s against one part's %s: %.1fx one part; %d calls, %d ledger rows",
			i+1, limit, r.files, pr.parts, pr.took.Round(time.Millisecond), one.took.Round(time.Millisecond),
			pr.took.Seconds()/one.took.Seconds(), pr.calls, pr.rows))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "model latency %s, part concurrency %d (calls of one review in parts at once)\n%s\n", r.latency, r.concurrency,
		strings.Join(lines, "\n"))
	return nil
}

// benchPR is a pull request of n new Go files of twenty-four lines each;
// every third builds SQL by concatenation (the simulated reviewer's
// blocking finding).
func benchPR(n int) string {
	var b strings.Builder
	for i := range n {
		name := fmt.Sprintf("svc/orders%02d.go", i)
		fmt.Fprintf(&b, "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,24 @@\n", name, name, name)
		for l := 1; l <= 24; l++ {
			if l == 12 && i%3 == 0 {
				fmt.Fprintf(&b, "+\tq := \"SELECT * FROM orders WHERE id = \" + id%d\n", i)
				continue
			}
			fmt.Fprintf(&b, "+\tcount%d_%d := step(%d, %d) // moves the order along\n", i, l, i, l)
		}
	}
	return b.String()
}

// partsItem is one diff bench parts reviews.
type partsItem struct{ name, diff string }

// partsItems are the evaluation set's diffs and then those of files.
func partsItems(files []string) ([]partsItem, error) {
	var items []partsItem
	for _, it := range evalset.Items() {
		items = append(items, partsItem{"evalset/" + it.Name, it.Diff})
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, cli.ConfigError{Err: err}
		}
		items = append(items, partsItem{filepath.Base(f), string(b)})
	}
	return items, nil
}

// partsRow is what bench parts measured of one work item.
type partsRow struct {
	parts       string // "whole", or how many
	calls, rows int    // model calls (attempt rows with a call) and ledger rows
	took        time.Duration
}

// benchPartsItem reviews it, the i-th item, waits for its outcome and its
// ledger rows, and writes its row to tw.
func benchPartsItem(ctx context.Context, bed *benchBed, tw io.Writer, i int, it partsItem) (partsRow, error) {
	var row partsRow
	id, err := benchSubmitReview(ctx, bed, it.diff, fmt.Sprintf("bench/parts#%d", i+1))
	if err != nil {
		return row, fmt.Errorf("%s: %w", it.name, err)
	}
	var state string
	for end := time.Now().Add(10 * time.Minute); ; {
		if err := bed.db.QueryRow(ctx, `SELECT state, updated_at - created_at FROM work WHERE id = $1`, id).Scan(&state, &row.took); err != nil {
			return row, err
		}
		if state != outcome.Queued && state != outcome.Running {
			break
		}
		if time.Now().After(end) {
			return row, fmt.Errorf("%s: still %s after 10 minutes", it.name, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var cost int64
	var cov []byte
	// The ledger's rows follow the outcome by moments.
	for end := time.Now().Add(30 * time.Second); ; {
		if err := bed.db.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM attempts WHERE work_id = $1 AND part IS DISTINCT FROM '*'),
				(SELECT count(*) FROM ledger WHERE work_id = $1),
				(SELECT coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1),
				(SELECT a.coverage FROM results r JOIN attempts a ON a.id = r.attempt_id WHERE r.work_id = $1)`, id).
			Scan(&row.calls, &row.rows, &cost, &cov); err != nil {
			return row, err
		}
		if row.rows >= row.calls {
			break
		}
		if time.Now().After(end) {
			return row, fmt.Errorf("%s: %d ledger rows for %d calls after 30 s", it.name, row.rows, row.calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	row.parts = "whole"
	reviewed := "all"
	if cov != nil {
		var cv diff.Coverage
		if err := json.Unmarshal(cov, &cv); err != nil {
			return row, err
		}
		row.parts, reviewed = fmt.Sprint(cv.Parts), fmt.Sprintf("%d of %d parts", len(cv.Reviewed), cv.Parts)
	}
	fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", it.name, len(it.diff), row.parts, row.calls, row.rows, cost,
		row.took.Round(time.Millisecond), state, reviewed)
	return row, nil
}

// benchSubmitReview submits text as a code review of source and returns
// its work id. The ledger's rows of a work are written after its outcome:
// the caller reads them once it has one.
func benchSubmitReview(ctx context.Context, bed *benchBed, text, source string) (string, error) {
	in, _ := json.Marshal(map[string]string{"diff": text, "title": "bench"})
	body, _ := json.Marshal(ingress.SubmitRequest{Contract: "code-review", SourceID: source,
		Revision: fmt.Sprintf("%040x", time.Now().UnixNano()), Input: in})
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, bed.cell.URL+"/v1/work", bytes.NewReader(body))
	hr.Header.Set("Authorization", "Bearer "+bed.tokens["acme"])
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("submit: %s: %s", resp.Status, raw)
	}
	var r ingress.SubmitResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", err
	}
	return r.WorkID, nil
}
