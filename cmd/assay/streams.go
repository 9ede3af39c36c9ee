package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/event"
)

const streamsUsage = `usage: assay streams [--json] [--region R]

The cell's streams (messages, bytes, first and last sequence and time) and
each stream's consumers with pending, ack pending, redelivered and waiting
counts. NATS is $ASSAY_NATS_URL.
`

// StreamView is one stream as assay streams shows it.
type StreamView struct {
	Stream    string         `json:"stream"`
	Subjects  []string       `json:"subjects"`
	Messages  uint64         `json:"messages"`
	Bytes     uint64         `json:"bytes"`
	FirstSeq  uint64         `json:"firstSeq"`
	LastSeq   uint64         `json:"lastSeq"`
	FirstTime time.Time      `json:"firstTime"`
	LastTime  time.Time      `json:"lastTime"`
	MaxAge    string         `json:"maxAge"`
	Consumers []ConsumerView `json:"consumers"`
}

// ConsumerView is one consumer of a stream.
type ConsumerView struct {
	Name        string `json:"name"`
	Durable     bool   `json:"durable"`
	Filter      string `json:"filter,omitempty"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ackPending"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting"`
	Delivered   uint64 `json:"deliveredStreamSeq"`
	AckFloor    uint64 `json:"ackFloorStreamSeq"`
	AckWait     string `json:"ackWait"`
	MaxDeliver  int    `json:"maxDeliver"`
}

// streamsCmd runs `assay streams`.
func streamsCmd(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("assay streams", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	pos, err := parseArgs(fs, args, streamsUsage)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.ConfigError{Err: fmt.Errorf("unexpected argument %q\n%s", pos[0], streamsUsage)}
	}
	cfg, err := loadCell("assay streams", *region, "")
	if err != nil {
		return err
	}
	nc, js, err := connectNATS(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	views, err := cellStreams(ctx, js, cfg.Names())
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(views)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ\tLAST MESSAGE\tMAX AGE")
	for _, v := range views {
		last := "-"
		if !v.LastTime.IsZero() {
			last = v.LastTime.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", v.Stream, v.Messages, v.Bytes, v.FirstSeq, v.LastSeq, last, v.MaxAge)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "STREAM\tCONSUMER\tFILTER\tPENDING\tACK PENDING\tREDELIVERED\tWAITING\tACK WAIT")
	for _, v := range views {
		for _, c := range v.Consumers {
			name := c.Name
			if !c.Durable {
				name += " (ephemeral)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", v.Stream, name, orDash(c.Filter), c.Pending, c.AckPending,
				c.Redelivered, c.Waiting, c.AckWait)
		}
	}
	return tw.Flush()
}

// cellStreams reads the cell's streams and their consumers. A stream the
// broker does not have is an error that names it.
func cellStreams(ctx context.Context, js jetstream.JetStream, n event.Names) ([]StreamView, error) {
	var out []StreamView
	for _, kind := range event.Kinds {
		st, err := js.Stream(ctx, n.Stream(kind))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s: not found (is this cell's installation %q and cell %q?)", n.Stream(kind), n.Installation, n.Cell)
		}
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", n.Stream(kind), err)
		}
		info := st.CachedInfo()
		v := StreamView{Stream: info.Config.Name, Subjects: info.Config.Subjects, Messages: info.State.Msgs,
			Bytes: info.State.Bytes, FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq,
			FirstTime: info.State.FirstTime, LastTime: info.State.LastTime, MaxAge: info.Config.MaxAge.String(),
			Consumers: []ConsumerView{}}
		list := st.ListConsumers(ctx)
		for ci := range list.Info() {
			filter := ci.Config.FilterSubject
			if filter == "" {
				filter = strings.Join(ci.Config.FilterSubjects, ",")
			}
			v.Consumers = append(v.Consumers, ConsumerView{Name: ci.Name, Durable: ci.Config.Durable != "", Filter: filter,
				Pending: ci.NumPending, AckPending: ci.NumAckPending, Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting,
				Delivered: ci.Delivered.Stream, AckFloor: ci.AckFloor.Stream, AckWait: ci.Config.AckWait.String(),
				MaxDeliver: ci.Config.MaxDeliver})
		}
		if err := list.Err(); err != nil {
			return nil, fmt.Errorf("stream %s: consumers: %w", info.Config.Name, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
