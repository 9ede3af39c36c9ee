package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
	"assay.dev/pkg/store"
)

// CloudEvents attributes of an exported model call.
const (
	cloudEventsVersion = "1.0"
	modelCallType      = "dev.assay.model.call"
)

// cloudEvent is one ledger row as a CloudEvent 1.0 in its JSON format
// (structured mode), as OpenMeter ingests it.
type cloudEvent struct {
	SpecVersion     string        `json:"specversion"`
	ID              string        `json:"id"`
	Source          string        `json:"source"`
	Type            string        `json:"type"`
	Subject         string        `json:"subject"`
	Time            string        `json:"time"`
	DataContentType string        `json:"datacontenttype"`
	Data            modelCallData `json:"data"`
}

// modelCallData is what an exported event says of its model call.
type modelCallData struct {
	Model            string `json:"model"`
	ServedModel      string `json:"servedModel,omitempty"`
	Contract         string `json:"contract"`
	ContractVersion  string `json:"contractVersion"`
	WorkID           string `json:"workId"`
	Outcome          string `json:"outcome"`
	InputUnits       int64  `json:"inputUnits"`
	CachedInputUnits int64  `json:"cachedInputUnits"`
	OutputUnits      int64  `json:"outputUnits"`
	ReasoningUnits   int64  `json:"reasoningUnits"`
	CostMicros       int64  `json:"costMicros"`
	Estimated        bool   `json:"estimated"`
	Shadow           bool   `json:"shadow"`
}

// modelCallEvent is the event of one ledger row from source.
func modelCallEvent(source string, r store.ExportedRow) cloudEvent {
	return cloudEvent{SpecVersion: cloudEventsVersion, ID: r.AttemptID, Source: source, Type: modelCallType,
		Subject: r.TenantID, Time: r.OccurredAt.UTC().Format(time.RFC3339Nano), DataContentType: "application/json",
		Data: modelCallData{Model: r.Model, ServedModel: r.ServedModel, Contract: r.Contract, ContractVersion: r.ContractVersion,
			WorkID: r.WorkID, Outcome: r.Outcome, InputUnits: r.InputUnits, CachedInputUnits: r.CachedInputUnits,
			OutputUnits: r.OutputUnits, ReasoningUnits: r.ReasoningUnits, CostMicros: r.CostMicros, Estimated: r.Estimated,
			Shadow: r.Shadow}}
}

// exportFlags are what assay usage export is told.
type exportFlags struct {
	dbURL, format, source string
	q                     store.LedgerExport
}

func parseExportFlags(args []string) (exportFlags, error) {
	var f exportFlags
	fs := flag.NewFlagSet("assay usage export", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.dbURL, "database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	fs.StringVar(&f.format, "format", "", "cloudevents (JSON lines) or cloudevents-batch (one JSON array)")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "the cell's region ($ASSAY_REGION), in the events' source")
	fs.StringVar(&f.source, "source", "", "the events' source; default urn:assay:INSTALLATION:REGION")
	fs.StringVar(&f.q.Tenant, "tenant", "", "one tenant's calls alone")
	since := fs.String("since", "", "RFC 3339 time or duration ago; default: everything")
	after := fs.String("after", "", "the cursor an earlier export printed")
	fs.IntVar(&f.q.Limit, "limit", 0, "at most this many events; default all")
	err := fs.Parse(args)
	switch {
	case err != nil:
		return f, err
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case f.format != "cloudevents" && f.format != "cloudevents-batch":
		return f, fmt.Errorf("--format %q: want cloudevents (one event a line) or cloudevents-batch (one JSON array)", f.format)
	case f.q.Limit < 0:
		return f, fmt.Errorf("--limit %d is negative", f.q.Limit)
	case f.dbURL == "":
		return f, config.Missing("ASSAY_DATABASE_URL")
	case f.source == "" && *region == "":
		return f, fmt.Errorf("%w (the events' source names it; or give --source)", config.Missing("ASSAY_REGION"))
	}
	if f.source == "" {
		f.source = "urn:assay:" + envOr("ASSAY_INSTALLATION", event.DefaultInstallation) + ":" + *region
	}
	if f.q.Since, err = parseWhen(*since, time.Now()); err != nil {
		return f, fmt.Errorf("--since: %w", err)
	}
	if *after != "" {
		if f.q.After, err = store.ParseLedgerCursor(*after); err != nil {
			return f, fmt.Errorf("--after: %w", err)
		}
	}
	return f, nil
}

// usageExport is `assay usage export`: the cell's ledger as CloudEvents,
// from a cursor on, and the cursor to resume from on stderr. The cursor is
// printed once every event before it is written out; after a failure it is
// the last event's that was.
func usageExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseExportFlags(args)
	if err != nil {
		return cli.ConfigError{Err: err}
	}
	st, err := openStore(ctx, f.dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	out := &eventWriter{w: bufio.NewWriter(stdout), batch: f.format == "cloudevents-batch"}
	cursor, exportErr := st.ExportLedger(ctx, f.q, func(r store.ExportedRow) error {
		return out.write(modelCallEvent(f.source, r))
	})
	if err := out.close(); err != nil {
		return errors.Join(exportErr, fmt.Errorf("writing the events: %w; resume from the cursor given before", err))
	}
	fmt.Fprintf(stderr, "cursor %s (%d events)\n", cursor, out.n)
	return exportErr
}

// eventWriter writes events as JSON lines, or as one JSON array.
type eventWriter struct {
	w     *bufio.Writer
	batch bool
	n     int
	err   error
}

func (e *eventWriter) write(ev cloudEvent) error {
	if e.err != nil {
		return e.err
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		e.err = err
		return err
	}
	before, after := "", "\n"
	if e.batch {
		before, after = ",\n", ""
		if e.n == 0 {
			before = "[\n"
		}
	}
	_, e.err = fmt.Fprintf(e.w, "%s%s%s", before, raw, after)
	e.n++
	return e.err
}

// close ends the array of a batch and writes out what is buffered.
func (e *eventWriter) close() error {
	if e.err != nil {
		return e.err
	}
	if e.batch {
		end := "\n]\n"
		if e.n == 0 {
			end = "[]\n"
		}
		if _, err := e.w.WriteString(end); err != nil {
			return err
		}
	}
	return e.w.Flush()
}
