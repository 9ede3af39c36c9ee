package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/api"
	"assay.dev/pkg/outcome"
)

// The tenant's side of `assay work`: submit, get, watch and list over the
// cell's HTTP API with a tenant token, as any caller reaches it. The token
// is read from $ASSAY_TOKEN or --token-file, never from a flag, so it does
// not show in a process listing or a shell's history.

const workAPIUsage = `
  submit [FILE|-]   post the request in FILE (or standard input) to POST
                    /v1/work, as the API takes it (contract, sourceId,
                    revision, input, lane, deadlineSeconds); prints the answer,
                    duplicate or not; --watch follows the work until it ends
  get ID            the work as GET /v1/work/ID shows it: state, attempts,
                    result, publications
  watch ID          follow the work's events (GET /v1/work/ID/events) until
                    it has its outcome (and its review item, if any, is
                    resolved): a line per event on a terminal, one JSON object
                    per event otherwise; a dropped stream is picked up where it
                    left off for --give-up-after (default 2m) without contact
  list              with a tenant token at hand, the tenant's work over GET
                    /v1/work (--state, --lane, --since, --limit, --after as
                    the cursor the last page gave, --json)

  submit, get, watch and list over HTTP take --url (default $ASSAY_URL, the
  cell's ingress) and the tenant's token from $ASSAY_TOKEN or --token-file
  FILE; list without a token reads the cell's Postgres as an operator.
`

// apiClient is the tenant's client of the cell's HTTP API, with the work
// commands' calls.
type apiClient struct{ *cli.APIClient }

// apiFlags adds --url and --token-file to fs; client makes the client
// they name once fs is parsed.
func apiFlags(fs *flag.FlagSet) (client func() (*apiClient, error)) {
	base := fs.String("url", os.Getenv("ASSAY_URL"), "the cell's ingress ($ASSAY_URL)")
	tokenFile := fs.String("token-file", "", "a file holding the tenant's token (else $ASSAY_TOKEN)")
	return func() (*apiClient, error) {
		token, err := tenantToken(*tokenFile)
		if err != nil {
			return nil, err
		}
		if *base == "" {
			return nil, cli.ConfigError{Err: errors.New("--url: no cell named (set --url or $ASSAY_URL to the cell's ingress, http://host:port)")}
		}
		u, err := url.Parse(*base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, cli.ConfigError{Err: fmt.Errorf("--url: %q is not an http(s) address of the cell's ingress", *base)}
		}
		return &apiClient{&cli.APIClient{Base: strings.TrimRight(*base, "/"), Token: token, HTTP: &http.Client{}}}, nil
	}
}

// tokenAtHand says whether a tenant token is given, by $ASSAY_TOKEN or
// --token-file among args: then `work list` asks the API, else Postgres.
func tokenAtHand(args []string) bool {
	if strings.TrimSpace(os.Getenv("ASSAY_TOKEN")) != "" {
		return true
	}
	return slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(strings.TrimLeft(a, "-"), "token-file") && strings.HasPrefix(a, "-")
	})
}

// tenantToken is the token in file, else $ASSAY_TOKEN.
func tenantToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", cli.ConfigError{Err: fmt.Errorf("--token-file: %w", err)}
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", cli.ConfigError{Err: fmt.Errorf("--token-file: %s is empty", file)}
	}
	if t := strings.TrimSpace(os.Getenv("ASSAY_TOKEN")); t != "" {
		return t, nil
	}
	return "", cli.ConfigError{Err: errors.New("no tenant token: set $ASSAY_TOKEN or --token-file FILE")}
}

// workAPI runs submit, get and watch, and list when a token is at hand.
func workAPI(ctx context.Context, verb string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay work "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	client := apiFlags(fs)
	watch := fs.Bool("watch", false, "submit: follow the work until it ends")
	giveUp := fs.Duration("give-up-after", 2*time.Minute, "watch: how long a dropped stream is tried again without contact")
	state := fs.String("state", "", "list: one work state")
	lane := fs.String("lane", "", "list: interactive or batch")
	since := fs.String("since", "", "list: created at or after this time (RFC 3339) or this long ago (a duration)")
	limit := fs.Int("limit", 0, "list: at most this many (1 to 1000; the API's default 100)")
	after := fs.String("after", "", "list: the cursor the last page gave")
	asJSON := fs.Bool("json", false, "list: the API's JSON as it is")
	pos, err := parseArgs(fs, args, workUsage)
	if err != nil {
		return err
	}
	want := map[string]int{"submit": 1, "get": 1, "watch": 1, "list": 0}[verb]
	if verb == "submit" && len(pos) == 0 {
		pos = []string{"-"}
	}
	if len(pos) != want {
		return cli.ConfigError{Err: fmt.Errorf("work %s takes %d argument(s), got %d\n%s", verb, want, len(pos), workUsage)}
	}
	if *giveUp <= 0 {
		return cli.ConfigError{Err: fmt.Errorf("--give-up-after: %s is not a positive duration", *giveUp)}
	}
	c, err := client()
	if err != nil {
		return err
	}
	switch verb {
	case "submit":
		return c.submit(ctx, pos[0], *watch, *giveUp, stdout)
	case "get":
		var v json.RawMessage
		if _, err := c.Call(ctx, http.MethodGet, "/v1/work/"+url.PathEscape(pos[0]), nil, &v); err != nil {
			return err
		}
		return printIndented(stdout, v)
	case "watch":
		return c.watch(ctx, pos[0], *giveUp, stdout)
	}
	q, err := workListQuery(*state, *lane, *after, *since, *limit)
	if err != nil {
		return err
	}
	return c.list(ctx, q, *asJSON, stdout)
}

// workListQuery is GET /v1/work's query of list's flags.
func workListQuery(state, lane, after, since string, limit int) (url.Values, error) {
	q := url.Values{}
	for k, v := range map[string]string{"state": state, "lane": lane, "cursor": after} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if limit != 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	if since != "" {
		at, err := sinceTime(since)
		if err != nil {
			return nil, cli.ConfigError{Err: fmt.Errorf("--since: %v", err)}
		}
		q.Set("since", at.UTC().Format(time.RFC3339Nano))
	}
	return q, nil
}

// list prints a page of GET /v1/work?q: the API's JSON as it is, or a
// table and the command that gives the next page.
func (c *apiClient) list(ctx context.Context, q url.Values, asJSON bool, stdout io.Writer) error {
	var list api.WorkList
	var raw json.RawMessage
	if _, err := c.Call(ctx, http.MethodGet, "/v1/work?"+q.Encode(), nil, &raw); err != nil {
		return err
	}
	if asJSON {
		return printIndented(stdout, raw)
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORK\tSTATE\tCONTRACT\tSOURCE\tREVISION\tATTEMPTS\tCREATED")
	for _, w := range list.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", w.WorkID, w.State, w.Contract, w.SourceID, w.Revision, w.Attempts,
			w.CreatedAt.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if list.Next != "" {
		fmt.Fprintf(stdout, "more: assay work list --after %s\n", list.Next)
	}
	return nil
}

// sinceTime reads an RFC 3339 time, or a duration back from now.
func sinceTime(v string) (time.Time, error) {
	if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return at, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", v)
}

func printIndented(w io.Writer, raw json.RawMessage) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// submit posts the request in file ("-": standard input).
func (c *apiClient) submit(ctx context.Context, file string, watch bool, giveUp time.Duration, stdout io.Writer) error {
	var body []byte
	var err error
	if file == "-" {
		body, err = io.ReadAll(os.Stdin)
	} else {
		body, err = os.ReadFile(file)
	}
	if err != nil {
		return cli.ConfigError{Err: fmt.Errorf("read the request: %w", err)}
	}
	if !json.Valid(body) {
		return cli.ConfigError{Err: fmt.Errorf("%s is not JSON: the request is an object with contract, sourceId, revision and input", file)}
	}
	var raw json.RawMessage
	if _, err := c.Call(ctx, http.MethodPost, "/v1/work", body, &raw); err != nil {
		return err
	}
	if !watch {
		return printIndented(stdout, raw)
	}
	var sr api.SubmitResponse
	if err := json.Unmarshal(raw, &sr); err != nil {
		return err
	}
	if terminal(stdout) {
		dup := ""
		if sr.Duplicate {
			dup = " (a duplicate: the work already there)"
		}
		fmt.Fprintf(stdout, "%s submitted in %s%s\n", sr.WorkID, sr.Region, dup)
	}
	return c.watch(ctx, sr.WorkID, giveUp, stdout)
}

// terminal says whether w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// sseFrame is one event of a server-sent event stream.
type sseFrame struct {
	ID, Event string
	Data      json.RawMessage
}

// watch follows the work's events until the stream's end event, or an
// answer of 204 (nothing after what was had: the work is over). A stream
// cut short is asked for again from the last event id, with a pause
// growing to 5 s, until giveUp has passed without contact.
func (c *apiClient) watch(ctx context.Context, id string, giveUp time.Duration, stdout io.Writer) error {
	show := eventPrinter(stdout)
	last := ""
	contact := time.Now()
	pause := 200 * time.Millisecond
	for {
		done, got, err := c.follow(ctx, id, last, func(f sseFrame) error {
			last = f.ID
			contact = time.Now()
			return show(f)
		})
		if done {
			return err
		}
		var refused *cli.APIError
		if errors.As(err, &refused) && refused.Status/100 == 4 && refused.Status != http.StatusTooManyRequests {
			return err // retrying cannot help: a wrong id, token or mark
		}
		if got {
			pause = 200 * time.Millisecond
		}
		if time.Since(contact) > giveUp {
			return fmt.Errorf("watch %s: no contact with the cell for %s (last: %v); run it again to go on from the start", id, giveUp, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// follow reads one connection's events; done says the work's stream ended
// (or err cannot be retried), got that some event came.
func (c *apiClient) follow(ctx context.Context, id, last string, on func(sseFrame) error) (done, got bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/v1/work/"+url.PathEscape(id)+"/events", nil)
	if err != nil {
		return true, false, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "text/event-stream")
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return ctx.Err() != nil, false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNoContent:
		return true, false, nil
	case resp.StatusCode != http.StatusOK:
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return false, false, cli.DecodeAPIError(resp.StatusCode, raw)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var f sseFrame
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if f.Event == "" && len(data) == 0 {
				continue // a heartbeat's end
			}
			f.Data = json.RawMessage(strings.Join(data, "\n"))
			if f.Event == "end" {
				return true, got, on(f)
			}
			if err := on(f); err != nil {
				return true, got, err
			}
			got, f, data = true, sseFrame{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			f.ID = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			f.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if err := sc.Err(); err != nil {
		return ctx.Err() != nil, got, err
	}
	return ctx.Err() != nil, got, errors.New("the stream ended before its end event")
}

// eventPrinter writes each event as a line a person reads when w is a
// terminal, else as one JSON object per line.
func eventPrinter(w io.Writer) func(sseFrame) error {
	if !terminal(w) {
		enc := json.NewEncoder(w)
		return func(f sseFrame) error {
			return enc.Encode(struct {
				ID    string          `json:"id,omitempty"`
				Event string          `json:"event"`
				Data  json.RawMessage `json:"data,omitempty"`
			}{f.ID, f.Event, f.Data})
		}
	}
	return func(f sseFrame) error {
		var ev api.WorkEvent
		_ = json.Unmarshal(f.Data, &ev)
		at := time.Now()
		if ev.At != nil {
			at = *ev.At
		}
		line := f.Event
		switch {
		case f.Event == "end":
			var end struct{ Reason string }
			_ = json.Unmarshal(f.Data, &end)
			line = "done: " + end.Reason
		case f.Event == outcome.Running:
			line = fmt.Sprintf("attempt %d started", ev.Attempt)
		case f.Event == "attempt":
			line = fmt.Sprintf("attempt %d: %s", ev.Attempt, ev.Outcome)
		case f.Event == "review":
			line = "held for a person's review (" + ev.ReviewID + ")"
		case f.Event == "resolved":
			line = fmt.Sprintf("review resolved: %s by %s", ev.Verdict, ev.By)
		case ev.Outcome != "":
			line = "outcome: " + ev.Outcome
			var out struct{ Findings []json.RawMessage }
			if json.Unmarshal(ev.Output, &out) == nil && out.Findings != nil {
				line += fmt.Sprintf(", %d findings", len(out.Findings))
			}
		}
		if ev.Reason != "" && f.Event != "end" {
			line += " — " + ev.Reason
		}
		_, err := fmt.Fprintf(w, "%s  %s\n", at.Local().Format("15:04:05.000"), line)
		return err
	}
}
