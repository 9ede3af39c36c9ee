//go:build !operator

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/devkit/devpg"
	"assay.dev/pkg/diff"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
	"assay.dev/services/classifier"
	"assay.dev/services/ingress"
)

const benchPartsUsage = `usage: assay bench parts [--part-units N] [--cost-cap MICROS] [FILE.diff ...]

Reviews the evaluation set and each unified diff FILE, one at a time, on a
cell of its own with the simulated provider, and prints per work item its
parts, model calls, ledger cost and time from created to its outcome.
ASSAY_DATABASE_URL names a Postgres to make the cell's database on (else a
throwaway one is started).`

// benchParts measures reviews in parts: what each work item cost in calls,
// money and time.
func benchParts(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay bench parts", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	units := fs.Int("part-units", 0, "the part size in model units (default: the contract's)")
	capMicros := fs.Int64("cost-cap", 0, "the work cost cap in micro-dollars (default: none)")
	if err := fs.Parse(args); err != nil {
		return configError{fmt.Errorf("%v\n%s", err, benchPartsUsage)}
	}
	items, err := partsItems(fs.Args())
	if err != nil {
		return err
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
	bed, err := startBenchBed(ctx, base, cell.Options{Classifier: classifier.Config{PartUnits: *units, WorkCostCap: *capMicros},
		Log: benchLogger(io.Discard, 0, "")}, []string{"acme"})
	if err != nil {
		return err
	}
	defer bed.close()
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "work\tdiff bytes\tparts\tcalls\tcost µ$\ttime\toutcome\treviewed")
	for i, it := range items {
		if err := benchPartsItem(ctx, bed, tw, i, it); err != nil {
			return err
		}
	}
	return tw.Flush()
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
			return nil, configError{err}
		}
		items = append(items, partsItem{filepath.Base(f), string(b)})
	}
	return items, nil
}

// benchPartsItem reviews it, the i-th item, waits for its outcome and its
// ledger rows, and writes its row to tw.
func benchPartsItem(ctx context.Context, bed *benchBed, tw io.Writer, i int, it partsItem) error {
	id, err := benchSubmitReview(ctx, bed, it.diff, fmt.Sprintf("bench/parts#%d", i+1))
	if err != nil {
		return fmt.Errorf("%s: %w", it.name, err)
	}
	var state string
	var took time.Duration
	for end := time.Now().Add(10 * time.Minute); ; {
		if err := bed.db.QueryRow(ctx, `SELECT state, updated_at - created_at FROM work WHERE id = $1`, id).Scan(&state, &took); err != nil {
			return err
		}
		if state != outcome.Queued && state != outcome.Running {
			break
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s: still %s after 10 minutes", it.name, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var calls, rows int
	var cost int64
	var cov []byte
	// The ledger's rows follow the outcome by moments.
	for end := time.Now().Add(30 * time.Second); ; {
		if err := bed.db.QueryRow(ctx, `SELECT
				(SELECT count(*) FROM attempts WHERE work_id = $1 AND part IS DISTINCT FROM '*'),
				(SELECT count(*) FROM ledger WHERE work_id = $1),
				(SELECT coalesce(sum(cost_micros), 0) FROM ledger WHERE work_id = $1),
				(SELECT a.coverage FROM results r JOIN attempts a ON a.id = r.attempt_id WHERE r.work_id = $1)`, id).
			Scan(&calls, &rows, &cost, &cov); err != nil {
			return err
		}
		if rows >= calls {
			break
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s: %d ledger rows for %d calls after 30 s", it.name, rows, calls)
		}
		time.Sleep(20 * time.Millisecond)
	}
	parts, reviewed := "whole", "all"
	if cov != nil {
		var cv diff.Coverage
		if err := json.Unmarshal(cov, &cv); err != nil {
			return err
		}
		parts, reviewed = fmt.Sprint(cv.Parts), fmt.Sprintf("%d of %d parts", len(cv.Reviewed), cv.Parts)
	}
	fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\n", it.name, len(it.diff), parts, calls, cost,
		took.Round(time.Millisecond), state, reviewed)
	return nil
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
